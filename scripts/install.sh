#!/usr/bin/env bash
# Installs the fencelock command with its man pages and shell completions, for the current user.
#   scripts/install.sh            cargo install --path . (into ~/.cargo/bin), then the pages and
#                                 completions
# Where things go (override with the environment):
#   MAN_DIR        man pages                  default ${XDG_DATA_HOME:-~/.local/share}/man/man1
#   BASH_DIR       bash completion            default ${XDG_DATA_HOME:-~/.local/share}/bash-completion/completions
#   ZSH_DIR        zsh completion (_fencelock) default ${XDG_DATA_HOME:-~/.local/share}/zsh/site-functions
#   FISH_DIR       fish completion            default ${XDG_CONFIG_HOME:-~/.config}/fish/completions
#   FENCELOCK_BIN  an already built fencelock binary: skips `cargo install`
# bash-completion and fish look in those directories by themselves; zsh needs the directory in
# its fpath (see the README, "Shell completions"); man finds ~/.local/share/man through PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
man_dir=${MAN_DIR:-$data/man/man1}
bash_dir=${BASH_DIR:-$data/bash-completion/completions}
zsh_dir=${ZSH_DIR:-$data/zsh/site-functions}
fish_dir=${FISH_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/fish/completions}

if [ -n "${FENCELOCK_BIN:-}" ]; then
  bin=$FENCELOCK_BIN
else
  (cd "$here/.." && cargo install --locked --path .)
  bin=${CARGO_HOME:-$HOME/.cargo}/bin/fencelock
fi
[ -x "$bin" ] || { echo "install.sh: no fencelock binary at $bin" >&2; exit 1; }

mkdir -p "$man_dir" "$bash_dir" "$zsh_dir" "$fish_dir"
"$bin" man --dir "$man_dir"
"$bin" completions bash > "$bash_dir/fencelock"
"$bin" completions zsh > "$zsh_dir/_fencelock"
"$bin" completions fish > "$fish_dir/fencelock.fish"
echo "installed $bin"
echo "  man pages:   $man_dir/fencelock.1 (and fencelock-*.1)"
echo "  completions: $bash_dir/fencelock, $zsh_dir/_fencelock, $fish_dir/fencelock.fish"
