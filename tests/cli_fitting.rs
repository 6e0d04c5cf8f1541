//! The command line fitting into shells and scripts: `--version`, completions, environment
//! variables for flags, and exec's waiting message (`-v`, `-q`).

mod common;

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_until, Standalone};
use fencelock::{Client, LockOptions};

/// `fencelock` with a clean environment of its own variables.
fn fencelock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    for (name, _) in std::env::vars() {
        if name.starts_with("FENCELOCK_") {
            command.env_remove(name);
        }
    }
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("run fencelock")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_prints_the_crate_version() {
    let output = run(fencelock().arg("--version"));
    assert!(output.status.success());
    assert_eq!(
        text(&output.stdout).trim(),
        format!("fencelock {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F _fencelock"),
        ("zsh", "#compdef fencelock"),
        ("fish", "complete -c fencelock"),
    ] {
        let output = run(fencelock().args(["completions", shell]));
        assert!(output.status.success(), "{shell}: {}", text(&output.stderr));
        let script = text(&output.stdout);
        assert!(
            script.contains(marker),
            "{shell}: no {marker:?} in\n{script}"
        );
        let long = |flag: &str| match shell {
            "fish" => format!("-l {flag}"),
            _ => format!("--{flag}"),
        };
        for word in [
            "exec".to_owned(),
            "latch".to_owned(),
            long("ttl"),
            long("prefix"),
        ] {
            assert!(script.contains(&word), "{shell}: {word} is not completed");
        }
    }
    let output = run(fencelock().args(["completions", "tcsh"]));
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
}

#[test]
fn help_names_the_environment_variable_of_every_flag() {
    let output = run(fencelock().args(["exec", "--help"]));
    assert!(output.status.success());
    let help = text(&output.stdout);
    for var in [
        "FENCELOCK_URL",
        "FENCELOCK_PREFIX",
        "FENCELOCK_TLS_CA",
        "FENCELOCK_TLS_CERT",
        "FENCELOCK_TLS_KEY",
        "FENCELOCK_TTL",
        "FENCELOCK_MAX_HOLD",
        "FENCELOCK_TIMEOUT",
        "FENCELOCK_WAIT_REPLICAS",
        "FENCELOCK_WAIT_TIMEOUT",
        "FENCELOCK_FENCE_MODE",
        "FENCELOCK_SLOT",
        "FENCELOCK_TAG",
        "FENCELOCK_READ",
        "FENCELOCK_WRITE",
        "FENCELOCK_FAIR",
        "FENCELOCK_PERMITS",
        "FENCELOCK_VERBOSE",
        "FENCELOCK_QUIET",
    ] {
        assert!(
            help.contains(&format!("[env: {var}")),
            "{var} missing in\n{help}"
        );
    }
    // exec's own options first, the options every command shares under a heading of their own.
    let global = help
        .find("Global options:")
        .expect("a global options heading");
    assert!(help.find("--ttl").is_some_and(|at| at < global), "{help}");
    assert!(help.find("--url").is_some_and(|at| at > global), "{help}");
}

#[test]
fn environment_variables_take_effect() {
    // A too-short TTL from the environment is refused before anything starts (nothing listens
    // on the URL: reaching Redis would exit 69).
    let output = run(fencelock()
        .env("FENCELOCK_URL", "redis://127.0.0.1:1")
        .env("FENCELOCK_TTL", "5ms")
        .args(["exec", "job", "--", "true"]));
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("minimum TTL"));

    let server = Standalone::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(Client::connect([server.url()])).unwrap();
    let guard = runtime
        .block_on(client.lock("job", &LockOptions::new().ttl(Duration::from_secs(30))))
        .unwrap();
    // FENCELOCK_TIMEOUT=0: one attempt on the held lock.
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_TIMEOUT", "0")
        .args(["exec", "job", "--", "true"]));
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    // FENCELOCK_PREFIX: another prefix is another lock.
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_TIMEOUT", "0")
        .env("FENCELOCK_PREFIX", "other")
        .args(["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_NAME"]));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // A flag wins over its variable.
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_TIMEOUT", "0")
        .env("FENCELOCK_PREFIX", "other")
        .args(["--prefix", "fencelock", "exec", "job", "--", "true"]));
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    runtime.block_on(guard.release()).unwrap();

    // A flag on the command line also wins over another flag's variable it conflicts with
    // (clap refused the pair, exit 64, naming neither variable): `--write` over
    // FENCELOCK_READ takes the write lock, `-v` over FENCELOCK_QUIET says what it waits for.
    let reading = runtime
        .block_on(client.read_lock("doc", &LockOptions::new().ttl(Duration::from_secs(30))))
        .unwrap();
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_READ", "1")
        .args(["exec", "--write", "-w", "300ms", "doc", "--", "true"]));
    assert_eq!(
        output.status.code(),
        Some(75),
        "a write lock waits for the reader: {}",
        text(&output.stderr)
    );
    runtime.block_on(reading.release()).unwrap();
    let held = runtime
        .block_on(client.lock("busy", &LockOptions::new().ttl(Duration::from_secs(30))))
        .unwrap();
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_QUIET", "1")
        .args(["-v", "exec", "-w", "300ms", "busy", "--", "true"]));
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("waiting for busy"),
        "{}",
        text(&output.stderr)
    );
    // `-w` takes a bare number of seconds, as flock(1)'s does (it needed a unit: exit 64).
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .args(["exec", "-w", "0.3", "busy", "--", "true"]));
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    runtime.block_on(held.release()).unwrap();
    // An empty FENCELOCK_URL is the default URL (it was "not a usable Redis URL", exit 64).
    let output = run(fencelock().env("FENCELOCK_URL", "").args(["status", "x"]));
    assert!(
        output.status.success() || text(&output.stderr).contains("127.0.0.1:6379"),
        "{:?}: {}",
        output.status.code(),
        text(&output.stderr)
    );
    // The command exec runs still gets the variable the command line overrode.
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_QUIET", "1")
        .args([
            "-v",
            "exec",
            "kept",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_QUIET",
        ]));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "1");
    // Both from the environment: still refused, also when the command has a flag of that
    // letter (its arguments are not fencelock's).
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_READ", "1")
        .env("FENCELOCK_WRITE", "1")
        .args(["exec", "doc", "--", "true"]));
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    let output = run(fencelock()
        .env("FENCELOCK_URL", server.url())
        .env("FENCELOCK_QUIET", "1")
        .env("FENCELOCK_VERBOSE", "1")
        .args(["exec", "doc", "--", "grep", "-v", "x", "/dev/null"]));
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
}

/// Runs `fencelock exec` in the background, collecting its stderr as it comes.
struct Running {
    child: std::process::Child,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn start(command: &mut Command) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start fencelock");
        let mut pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 256];
            while let Ok(n) = pipe.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Self { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn wait(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        // The reader thread ends at EOF; give it the time to append the last bytes.
        wait_until("stderr is drained", Duration::from_secs(5), || {
            Arc::strong_count(&self.stderr) == 1
        });
        (status.code(), self.stderr())
    }
}

#[test]
fn exec_says_what_it_waits_for_with_v_and_not_with_q() {
    let server = Standalone::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(Client::connect([server.url()])).unwrap();
    let guard = runtime
        .block_on(client.lock(
            "orders:42",
            &LockOptions::new().ttl(Duration::from_secs(30)),
        ))
        .unwrap();

    let waiting = Running::start(fencelock().args([
        "--url",
        &server.url(),
        "exec",
        "-v",
        "--timeout",
        "20s",
        "orders:42",
        "--",
        "true",
    ]));
    wait_until("the waiting message", Duration::from_secs(10), || {
        waiting.stderr().contains("waiting for orders:42")
    });
    runtime.block_on(guard.release()).unwrap();
    let (code, stderr) = waiting.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("waiting for"))
        .unwrap();
    assert!(
        line.starts_with("fencelock: waiting for orders:42: held by another owner, lease ends in "),
        "{line}"
    );
    let seconds: f64 = line
        .rsplit(' ')
        .next()
        .unwrap()
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(seconds > 0.0 && seconds <= 30.0, "{line}");

    // -q: silent while waiting (the timeout message at the end is an error, not a progress
    // message). Without -v and with stderr not a terminal: silent too.
    let guard = runtime
        .block_on(client.lock(
            "orders:42",
            &LockOptions::new().ttl(Duration::from_secs(30)),
        ))
        .unwrap();
    for flags in [&["-q"][..], &[][..]] {
        let mut command = fencelock();
        command
            .args(["--url", &server.url(), "exec"])
            .args(flags)
            .args(["--timeout", "300ms", "orders:42", "--", "true"]);
        let (code, stderr) = Running::start(&mut command).wait();
        assert_eq!(code, Some(75), "{flags:?}: {stderr}");
        assert!(!stderr.contains("waiting for"), "{flags:?}: {stderr}");
        assert!(
            stderr.contains("held by another owner"),
            "{flags:?}: {stderr}"
        );
    }
    // FENCELOCK_VERBOSE=1 is -v.
    let mut command = fencelock();
    command.env("FENCELOCK_VERBOSE", "1").args([
        "--url",
        &server.url(),
        "exec",
        "--timeout",
        "300ms",
        "orders:42",
        "--",
        "true",
    ]);
    let (code, stderr) = Running::start(&mut command).wait();
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("waiting for orders:42"), "{stderr}");
    runtime.block_on(guard.release()).unwrap();
}
