//! Helpers for the tests that drive the `fencelock` binary as child processes.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Sends `signal` to `child`.
pub fn kill(child: &Child, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// Waits (bounded: 20 s, then the child is killed and the test fails) for `child` to exit and
/// returns its output.
pub fn finish(mut child: Child) -> Output {
    let until = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("fencelock did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Asserts that `output`'s process died by `signal` (a shell reports 128 + its number), as
/// fencelock does when a signal ends its wait, so that a calling script stops.
pub fn assert_died_by(output: &Output, signal: i32) {
    assert_eq!(
        output.status.signal(),
        Some(signal),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts `command` with SIGINT, SIGQUIT, SIGHUP and SIGTERM at their default actions, as from
/// a terminal: a test run in the background of a shell script (CI) inherits SIGINT and SIGQUIT
/// ignored, and fencelock leaves a signal it was started with ignored ignored.
pub fn default_signals(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only signal(2), async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTERM] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}
