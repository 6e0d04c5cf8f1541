//! The Redis module (issue 24) for the tests: the path of its shared object, built once per
//! test binary with `scripts/build-module.sh` unless `FENCELOCK_MODULE` names one already
//! (scripts/test.sh builds it first and sets that), and servers that load it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::{Cluster, Launch, Node, Standalone};

/// The module's `.so`: `FENCELOCK_MODULE`, or built here (once per test binary).
pub fn module_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("FENCELOCK_MODULE") {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "FENCELOCK_MODULE={} is not a file",
                path.display()
            );
            return path;
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let output = Command::new("bash")
            .arg(root.join("scripts/build-module.sh"))
            .env(
                "CARGO_TARGET_DIR",
                std::env::var_os("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| root.join("target"))
                    .join("module"),
            )
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs scripts/build-module.sh");
        assert!(output.status.success(), "scripts/build-module.sh failed");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
        assert!(path.is_file(), "build-module.sh printed no .so path");
        path
    })
    .clone()
}

/// `--loadmodule PATH [ARGS]` for a server's command line (and `MODULE` allowed from loopback,
/// for tests that unload it). ARGS, for a standalone server (`standalone`) only: the module's
/// load arguments in `FENCELOCK_MODULE_ARGS` (split on whitespace, e.g. `release-deletes yes`,
/// which a node in cluster mode refuses), none by default.
pub fn load_args(standalone: bool) -> Vec<String> {
    let mut args = vec![
        "--loadmodule".to_owned(),
        module_path().display().to_string(),
    ];
    if standalone {
        if let Ok(extra) = std::env::var("FENCELOCK_MODULE_ARGS") {
            args.extend(extra.split_whitespace().map(str::to_owned));
        }
    }
    args.extend(["--enable-module-command".to_owned(), "local".to_owned()]);
    args
}

impl Standalone {
    /// A standalone server that loads the module (with `FENCELOCK_MODULE_ARGS`, see
    /// `load_args`).
    pub fn start_with_module() -> Self {
        let args = load_args(true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self {
            node: Node::spawn_launched(&args, Launch::default()),
        }
    }

    /// A standalone server that loads the module with exactly the load arguments `module_args`
    /// (e.g. `release-deletes yes`; `FENCELOCK_MODULE_ARGS` ignored).
    pub fn start_with_module_args(module_args: &[&str]) -> Self {
        let mut args = load_args(false);
        args.splice(2..2, module_args.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self {
            node: Node::spawn_launched(&args, Launch::default()),
        }
    }
}

impl Cluster {
    /// A 3-master/3-replica cluster whose nodes all load the module.
    pub fn start_with_module() -> Self {
        Self::start_with_args(&load_args(false), |_| Launch::default())
    }
}
