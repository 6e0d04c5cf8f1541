//! Issue 23's CLI contract through the binary, as a user types it, against real servers:
//! credentials that never leak, the default URL, `--json` everywhere (`unlock --force --json`
//! with `freed`), `top --once`, global `-v`/`-q` with the library's events, the man page and
//! install script, and the README's ACL rules.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{wait_until, Cluster, Node, Standalone};
use fencelock::{Client, LockOptions};
use serde_json::Value;

const PASSWORD: &str = "s3cret-Pw";

/// The binary with no FENCELOCK_* variable from the test's environment.
fn fencelock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    for (name, _) in std::env::vars() {
        if name.starts_with("FENCELOCK_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("run fencelock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    let text = stdout(output);
    assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// A URL of `server` without its password.
fn bare_url(server: &Standalone) -> String {
    format!("redis://127.0.0.1:{}", server.node.port)
}

#[test]
fn help_never_prints_an_environment_variables_value() {
    let dir = std::env::temp_dir().join(format!("fencelock-help-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let password_file = dir.join(format!("{PASSWORD}-file"));
    for args in [
        &["--help"][..],
        &["exec", "--help"],
        &["status", "--help"],
        &["unlock", "--help"],
        &["list", "--help"],
        &["top", "--help"],
        &["slot", "--help"],
        &["latch", "--help"],
        &["latch", "wait", "--help"],
        &["man"],
    ] {
        let output = run(fencelock()
            .env(
                "FENCELOCK_URL",
                format!("redis://admin:{PASSWORD}@10.0.0.1:6379"),
            )
            .env("FENCELOCK_USER", format!("user-{PASSWORD}"))
            .env("FENCELOCK_PASSWORD", PASSWORD)
            .env("FENCELOCK_PASSWORD_FILE", &password_file)
            .env("FENCELOCK_PREFIX", format!("prefix-{PASSWORD}"))
            .env("FENCELOCK_TIMEOUT", "17s")
            .args(args));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let text = stdout(&output) + &stderr(&output);
        assert!(!text.contains(PASSWORD), "{args:?} shows a secret:\n{text}");
        assert!(!text.contains("17s"), "{args:?} shows a value:\n{text}");
    }
    let help = stdout(&run(fencelock().args(["exec", "--help"])));
    for var in [
        "[env: FENCELOCK_URL]",
        "[env: FENCELOCK_USER]",
        "[env: FENCELOCK_PASSWORD_FILE]",
    ] {
        assert!(help.contains(var), "{var} not named in\n{help}");
    }
    assert!(help.contains("[default: redis://127.0.0.1:6379]"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_password_with_a_comma_in_the_url_works_and_is_never_shown() {
    let password = "se,cret-Pw";
    let server = Standalone::start_with_password(password);
    let port = server.node.port;
    let url = format!("redis://default:{password}@127.0.0.1:{port}");
    let output = run(fencelock().args(["--url", &url, "status", "job"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Two URLs in one value still split; the second's error never shows the first's password.
    let both = format!("{url},redis://default:{password}@127.0.0.1:1");
    let output = run(fencelock()
        .env("FENCELOCK_URL", &both)
        .args(["status", "job"]));
    let text = stdout(&output) + &stderr(&output);
    assert!(
        !text.contains("se,cret") && !text.contains("cret-Pw"),
        "{text}"
    );
    // A URL the client cannot use: named without the password.
    let bad = format!("redis://default:{password}@127.0.0.1:{port}/x/y");
    let output = run(fencelock().args(["--url", &bad, "status", "job"]));
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(
        !text.contains("se,cret") && !text.contains("cret-Pw"),
        "{text}"
    );
}

#[test]
fn the_password_comes_from_the_environment_a_file_or_the_url_and_is_never_shown() {
    let server = Standalone::start_with_password(PASSWORD);
    let url = bare_url(&server);
    let dir = server.node.dir().to_owned();

    // Without a password the server refuses: exit 69.
    let output = run(fencelock().args(["--url", &url, "status", "job"]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("authentication"),
        "{}",
        stderr(&output)
    );

    // FENCELOCK_PASSWORD.
    let output = run(fencelock()
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .args(["--url", &url, "status", "job"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("job mutex free"));

    // --password-file (its first line), also as FENCELOCK_PASSWORD_FILE; it wins over
    // FENCELOCK_PASSWORD.
    let file = dir.join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let output = run(fencelock()
        .env("FENCELOCK_PASSWORD", "wrong")
        .args(["--url", &url, "--password-file"])
        .arg(&file)
        .args(["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_NAME"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "job\n");
    let output = run(fencelock()
        .env("FENCELOCK_URL", &url)
        .env("FENCELOCK_PASSWORD_FILE", &file)
        .args(["list", "--json"]));
    let list = json(&output);
    assert_eq!(list[0]["name"], "job");
    assert_eq!(list[0]["held"], false);

    // An unreadable or empty file is bad input.
    let output = run(fencelock()
        .args(["--url", &url, "--password-file"])
        .arg(dir.join("missing"))
        .args(["status", "job"]));
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("password file"),
        "{}",
        stderr(&output)
    );
    for (text, said) in [
        ("", "is empty"),
        ("\n\n", "is empty"),
        (&*format!("\n{PASSWORD}\n"), "has an empty first line"),
    ] {
        let blank = dir.join("blank");
        std::fs::write(&blank, text).unwrap();
        let output = run(fencelock()
            .args(["--url", &url, "--password-file"])
            .arg(&blank)
            .args(["status", "job"]));
        assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
        assert!(stderr(&output).contains(said), "{}", stderr(&output));
        assert!(!stderr(&output).contains(PASSWORD), "{}", stderr(&output));
    }

    // A password in the URL still works.
    let output = run(fencelock().args(["--url", &server.url(), "status", "job", "--json"]));
    assert_eq!(json(&output)["held"], false);

    // A wrong password: refused, and no password shown, even with the library's events (-vv).
    for (url, password) in [
        (
            format!("redis://:{PASSWORD}x@127.0.0.1:{}", server.node.port),
            None,
        ),
        (url.clone(), Some(format!("{PASSWORD}x"))),
    ] {
        let mut command = fencelock();
        if let Some(password) = &password {
            command.env("FENCELOCK_PASSWORD", password);
        }
        let output = run(command.args(["-vv", "--url", &url, "status", "job"]));
        assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
        assert!(!stderr(&output).contains(PASSWORD), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("authentication failed"),
            "{}",
            stderr(&output)
        );
    }

    // A password for a server that has none: refused, saying so (it said "check the user name
    // and password").
    let open = Standalone::start();
    let output = run(fencelock().env("FENCELOCK_PASSWORD", PASSWORD).args([
        "--url",
        &open.url(),
        "status",
        "job",
    ]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the server has no password set"),
        "{}",
        stderr(&output)
    );
    assert!(!stderr(&output).contains(PASSWORD), "{}", stderr(&output));

    // A connect error that shows the URL redacts it, and a URL that does not parse too.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("redis://admin:{PASSWORD}@127.0.0.1:{closed}"),
        format!("redis://admin:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis://admin:{PASSWORD}@127.0.0.1:{closed},redis://:{PASSWORD}@127.0.0.1:1"),
    ] {
        let output = run(fencelock()
            .env("FENCELOCK_URL", &url)
            .args(["-vv", "exec", "job", "--", "true"]));
        assert!(
            matches!(output.status.code(), Some(64 | 69)),
            "{url}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains(PASSWORD), "{}", stderr(&output));
        assert!(!stderr(&output).is_empty());
    }
}

#[test]
fn the_default_url_is_redis_s_own() {
    // Whatever runs on this machine's 6379: either a server answered (exit 0) or the error
    // names 127.0.0.1:6379; never the old 7000.
    let output = run(fencelock().args(["status", "default-url-probe", "--json"]));
    match output.status.code() {
        Some(0) => assert_eq!(json(&output)["name"], "default-url-probe"),
        _ => {
            assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
            assert!(
                stderr(&output).contains("127.0.0.1:6379"),
                "{}",
                stderr(&output)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_everywhere_and_unlock_says_what_it_freed() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let cli = |args: &[&str]| run(fencelock().args(["--url", &url]).args(args));

    let slot = json(&cli(&["slot", "orders:42", "--json"]));
    let keys =
        fencelock::LockKeys::new("fencelock", "orders:42", &fencelock::Placement::ByName).unwrap();
    assert_eq!(slot["name"], "orders:42");
    assert_eq!(slot["slot"].as_u64(), Some(u64::from(keys.slot())));
    assert_eq!(slot["key"], keys.lock_key());

    // Latches: set, count-down, wait (--json before or after the latch subcommand).
    let set = json(&cli(&["latch", "--json", "set", "gate", "1"]));
    let generation = set["generation"].as_u64().unwrap();
    assert_eq!(set["name"], "gate");
    let down = json(&cli(&[
        "latch",
        "count-down",
        "gate",
        "--id",
        "a",
        "--json",
    ]));
    assert_eq!(
        (&down["name"], &down["id"], &down["remaining"]),
        (&"gate".into(), &"a".into(), &0.into())
    );
    let wait = json(&cli(&["latch", "wait", "gate", "--timeout", "0", "--json"]));
    assert_eq!(wait["generation"].as_u64(), Some(generation));

    // status, list, unlock: the state before, and whether it was freed.
    let guard = client.lock("orders:42", &options()).await.unwrap();
    let status = json(&cli(&["status", "orders:42", "--json"]));
    assert_eq!(status["held"], true);
    assert_eq!(status["exists"], true);
    assert_eq!(status["fence"].as_u64(), Some(u64::from(guard.fence())));
    let list = json(&cli(&["list", "--json"]));
    let listed: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["gate", "orders:42"]);

    let freed = json(&cli(&["unlock", "--force", "orders:42", "--json"]));
    assert_eq!(freed["freed"], true);
    assert_eq!(freed["held"], true, "the state before");
    assert_eq!(freed["fence"].as_u64(), Some(u64::from(guard.fence())));
    assert!(freed["lease_ms"].as_u64().unwrap() > 20_000);
    for field in status.as_object().unwrap().keys() {
        assert!(freed.get(field).is_some(), "unlock --json lacks {field}");
    }
    let again = json(&cli(&["unlock", "--force", "orders:42", "--json"]));
    assert_eq!(
        (&again["freed"], &again["held"]),
        (&false.into(), &false.into())
    );
    assert!(guard.release().await.unwrap_err().is_lock_lost());

    // A latch: freed means opened.
    json(&cli(&["latch", "set", "gate", "3"]));
    let opened = json(&cli(&["unlock", "--force", "--latch", "gate", "--json"]));
    assert_eq!(
        (&opened["freed"], &opened["latch_count"]),
        (&true.into(), &3.into())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn top_once_prints_one_plain_frame_and_json_and_a_pipe_means_once() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let guard = client.lock("jobs:nightly", &options()).await.unwrap();
    let _sem = client
        .semaphore("pool", 2)
        .unwrap()
        .acquire(&options())
        .await
        .unwrap();

    for args in [&["top", "--once"][..], &["top"]] {
        // stdout is a pipe here: plain `top` acts as --once instead of waiting for q.
        let output = run(fencelock()
            .args(["--url", &url])
            .args(args)
            .stdin(Stdio::null()));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let text = stdout(&output);
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
        assert!(
            text.starts_with("fencelock top   prefix fencelock   2 locks\n"),
            "{text}"
        );
        let header = text.lines().find(|l| l.starts_with("NAME")).unwrap();
        assert!(header.ends_with("GRANTS/S"), "{header}");
        let row = text
            .lines()
            .find(|l| l.starts_with("jobs:nightly "))
            .unwrap_or_else(|| panic!("no row in {text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1..3], ["mutex", "held"], "{row}");
        assert_eq!(cells[4], guard.fence().to_string(), "{row}");
        assert_eq!(cells[6], "-", "one frame has no rate: {row}");
        assert!(text
            .lines()
            .any(|l| l.starts_with("pool ") && l.contains("semaphore")));
    }

    let document = json(&run(
        fencelock().args(["--url", &url, "top", "--once", "--json"])
    ));
    assert_eq!(document["prefix"], "fencelock");
    assert_eq!(document["truncated"], false);
    let rows = document["locks"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let nightly = rows.iter().find(|r| r["name"] == "jobs:nightly").unwrap();
    assert_eq!(
        (
            &nightly["kind"],
            &nightly["state"],
            &nightly["grants_per_second"]
        ),
        (&"mutex".into(), &"held".into(), &Value::Null)
    );
    assert_eq!(nightly["fence"].as_u64(), Some(u64::from(guard.fence())));
}

#[tokio::test(flavor = "multi_thread")]
async fn verbose_and_quiet_are_global_and_vv_shows_the_library_events() {
    let server = Standalone::start();
    let url = server.url();

    // -vv (and RUST_LOG) print the library's tracing events on stderr, for any command.
    for (flags, env) in [
        (&["-vv"][..], None),
        (&[][..], Some("fencelock=debug")),
        (&["--verbose", "--verbose"][..], None),
    ] {
        let mut command = fencelock();
        if let Some(filter) = env {
            command.env("RUST_LOG", filter);
        }
        let output = run(command
            .args(["--url", &url, "status"])
            .args(flags)
            .arg("job"));
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("fencelock.connect") && stderr(&output).contains("connected"),
            "{flags:?} {env:?}: {}",
            stderr(&output)
        );
    }
    let quiet = run(fencelock().args(["--url", &url, "status", "job"]));
    assert_eq!(stderr(&quiet), "", "no events without -vv");

    // -v / -q before or after the subcommand: exec says what it waits for (stderr is no
    // terminal here), or not.
    let client = Client::connect([url.clone()]).await.unwrap();
    let holder = client
        .lock("busy", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    for (args, says) in [
        (
            &["-v", "exec", "--timeout", "1500ms", "busy", "--", "true"][..],
            true,
        ),
        (
            &["exec", "-v", "--timeout", "1500ms", "busy", "--", "true"],
            true,
        ),
        (
            &["exec", "--timeout", "1500ms", "busy", "--", "true"],
            false,
        ),
        (
            &["-q", "exec", "--timeout", "1500ms", "busy", "--", "true"],
            false,
        ),
    ] {
        let output = run(fencelock().args(["--url", &url]).args(args));
        assert_eq!(
            output.status.code(),
            Some(75),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(
            stderr(&output).contains("waiting for busy"),
            says,
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let output = run(fencelock().env("FENCELOCK_VERBOSE", "true").args([
        "--url",
        &url,
        "exec",
        "--timeout",
        "1500ms",
        "busy",
        "--",
        "true",
    ]));
    assert!(
        stderr(&output).contains("waiting for busy"),
        "{}",
        stderr(&output)
    );
    let output = run(fencelock().args(["--url", &url, "-v", "-q", "status", "busy"]));
    assert_eq!(output.status.code(), Some(64), "-v and -q conflict");
    holder.release().await.unwrap();
}

#[test]
fn the_man_page_comes_from_the_cli_definition_and_install_sh_installs_it() {
    let output = run(fencelock().arg("man"));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let page = stdout(&output);
    assert!(page.contains(".TH fencelock 1"), "{page}");
    for word in [
        "exec",
        "status",
        "unlock",
        "\\-\\-url",
        "\\-\\-password\\-file",
        "Exit status",
    ] {
        assert!(page.contains(word), "the man page lacks {word}");
    }
    assert!(!page.contains("\nman"), "the man subcommand is hidden");

    // install.sh with an already built binary (FENCELOCK_BIN skips `cargo install`) into a
    // scratch home.
    let home = std::env::temp_dir().join(format!("fencelock-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh");
    let output = Command::new("bash")
        .arg(script)
        .env("HOME", &home)
        .env_remove("XDG_DATA_HOME")
        .env_remove("XDG_CONFIG_HOME")
        .env("FENCELOCK_BIN", env!("CARGO_BIN_EXE_fencelock"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let read = |path: &str| {
        std::fs::read_to_string(home.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    assert!(read(".local/share/man/man1/fencelock.1").contains(".TH fencelock 1"));
    assert!(read(".local/share/man/man1/fencelock-exec.1").contains("fencelock\\-exec"));
    assert!(read(".local/share/bash-completion/completions/fencelock").contains("_fencelock"));
    assert!(read(".local/share/zsh/site-functions/_fencelock").contains("#compdef fencelock"));
    assert!(read(".config/fish/completions/fencelock.fish").contains("complete -c fencelock"));
    let _ = std::fs::remove_dir_all(&home);
}

/// The rules of the README's `user NAME on >PASSWORD ...` line for `user`.
fn readme_acl_rules(user: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let prefix = format!("user {user} ");
    let line = readme
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}...` line in README.md"));
    line[prefix.len()..]
        .split_whitespace()
        .map(|rule| rule.replace("PASSWORD", PASSWORD))
        .collect()
}

/// `ACL SETUSER user reset rules...` on `node`.
fn set_user_on(node: &Node, user: &str, rules: &[String]) {
    let mut command = redis::cmd("ACL");
    command.arg("SETUSER").arg(user).arg("reset");
    for rule in rules {
        command.arg(rule);
    }
    let _: () = node.cmd(&mut command);
}

fn set_user(server: &Standalone, user: &str, rules: &[String]) {
    set_user_on(&server.node, user, rules);
}

#[tokio::test(flavor = "multi_thread")]
async fn acl_the_readme_rules_are_enough_and_a_missing_permission_is_named() {
    let server = Standalone::start();
    let url = server.url();
    let locks = readme_acl_rules("fencelock-locks");
    let ops = readme_acl_rules("fencelock-ops");
    set_user(&server, "fencelock-locks", &locks);
    set_user(&server, "fencelock-ops", &ops);
    let as_user = |user: &str, args: &[&str]| {
        run(fencelock()
            .env("FENCELOCK_PASSWORD", PASSWORD)
            .args(["--url", &url, "--user", user])
            .args(args))
    };
    let ok = |output: Output, what: &str| {
        assert_eq!(output.status.code(), Some(0), "{what}: {}", stderr(&output));
        output
    };

    // The lock user: exec of every kind (one waits for a release, so the wake-up is used too),
    // latches.
    for kind in [
        &[][..],
        &["--read"],
        &["--write"],
        &["--fair"],
        &["--permits", "2"],
    ] {
        let mut args = vec!["exec"];
        args.extend_from_slice(kind);
        args.extend_from_slice(&["job", "--", "true"]);
        ok(as_user("fencelock-locks", &args), &format!("{args:?}"));
    }
    ok(
        as_user("fencelock-locks", &["exec", "a", "b", "--", "true"]),
        "multi-lock",
    );
    ok(
        as_user("fencelock-locks", &["latch", "set", "gate", "1"]),
        "latch set",
    );
    ok(
        as_user(
            "fencelock-locks",
            &["latch", "count-down", "gate", "--id", "x"],
        ),
        "count-down",
    );
    ok(
        as_user(
            "fencelock-locks",
            &["latch", "wait", "gate", "--timeout", "0"],
        ),
        "latch wait",
    );
    // hold: prints the token once held, releases on SIGTERM and exits 0.
    let mut hold = std::process::Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .args(["--url", &url, "--user", "fencelock-locks", "hold", "kept"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut token = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hold.stdout.take().unwrap()),
        &mut token,
    )
    .unwrap();
    assert!(
        token.trim().parse::<u64>().is_ok(),
        "hold printed {token:?}"
    );
    assert!(server.node.held("fencelock:{kept}:lock"));
    // SAFETY: kill(2) on the child's pid, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(hold.id() as i32, libc::SIGTERM) }, 0);
    let hold = hold.wait_with_output().unwrap();
    assert_eq!(hold.status.code(), Some(0), "hold: {}", stderr(&hold));
    assert!(!server.node.held("fencelock:{kept}:lock"));
    let holder = std::process::Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_PASSWORD", PASSWORD)
        .args([
            "--url",
            &url,
            "--user",
            "fencelock-locks",
            "exec",
            "held",
            "--",
            "sleep",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first holder", Duration::from_secs(10), || {
        server.node.held("fencelock:{held}:lock")
    });
    ok(
        as_user(
            "fencelock-locks",
            &["exec", "--timeout", "10s", "held", "--", "true"],
        ),
        "waiter",
    );
    let holder = holder.wait_with_output().unwrap();
    assert_eq!(holder.status.code(), Some(0), "{}", stderr(&holder));

    // --user without a password is refused, not quietly the default user.
    let output = run(fencelock().args(["--url", &url, "--user", "fencelock-ops", "status", "job"]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("authentication failed"),
        "{}",
        stderr(&output)
    );
    // -q: no note about the random id of a count-down.
    let output = as_user("fencelock-locks", &["-q", "latch", "count-down", "gate"]);
    assert_eq!(
        (stdout(&output).trim(), stderr(&output).as_str()),
        ("0", "")
    );

    // The operator: status, list, top --once, unlock --force, on a held lock.
    let client = Client::connect([url.clone()]).await.unwrap();
    let guard = client.lock("job", &options()).await.unwrap();
    let status = ok(
        as_user("fencelock-ops", &["status", "job", "--json"]),
        "status",
    );
    assert_eq!(json(&status)["held"], true);
    ok(
        as_user("fencelock-ops", &["status", "--latch", "gate"]),
        "status --latch",
    );
    let list = ok(as_user("fencelock-ops", &["list"]), "list");
    assert!(
        stdout(&list).contains("job mutex held"),
        "{}",
        stdout(&list)
    );
    let top = ok(as_user("fencelock-ops", &["top", "--once"]), "top --once");
    assert!(stdout(&top).contains("job "), "{}", stdout(&top));
    let unlocked = ok(
        as_user("fencelock-ops", &["unlock", "--force", "job", "--json"]),
        "unlock",
    );
    assert_eq!(json(&unlocked)["freed"], true);
    assert!(guard.release().await.unwrap_err().is_lock_lost());
    for kind in ["--read", "--fair", "--latch"] {
        ok(
            as_user("fencelock-ops", &["unlock", "--force", kind, "job"]),
            kind,
        );
    }

    // One rule less, one at a time: the error names what is missing.
    for (user, rules, missing, args, named) in [
        (
            "fencelock-ops",
            &ops,
            "+scan",
            &["list"][..],
            "the command SCAN (+scan)",
        ),
        (
            "fencelock-ops",
            &ops,
            "+info",
            &["status", "job"],
            "the command INFO (+info)",
        ),
        (
            "fencelock-ops",
            &ops,
            "+evalsha",
            &["status", "job"],
            "the command EVALSHA (+evalsha)",
        ),
        (
            "fencelock-locks",
            &locks,
            "~fencelock:*",
            &["exec", "job", "--", "true"],
            "~PREFIX:*",
        ),
        (
            "fencelock-locks",
            &locks,
            "+time",
            &["exec", "job", "--", "true"],
            "+time",
        ),
        (
            "fencelock-locks",
            &locks,
            "+hset",
            &["latch", "set", "gate", "1"],
            "+hset",
        ),
    ] {
        let fewer: Vec<String> = rules.iter().filter(|r| *r != missing).cloned().collect();
        assert_eq!(
            fewer.len() + 1,
            rules.len(),
            "{missing} is one of the README's rules"
        );
        set_user(&server, user, &fewer);
        let output = as_user(user, args);
        assert_eq!(
            output.status.code(),
            Some(69),
            "{missing}: {}",
            stderr(&output)
        );
        let text = stderr(&output);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with("fencelock: permission denied by the Redis ACL: the user may not ")
                && text.contains(named),
            "without {missing}: {text}"
        );
        assert!(!text.contains(PASSWORD));
        set_user(&server, user, rules);
    }
}

#[test]
fn acl_the_readme_rules_are_enough_on_a_cluster() {
    let cluster = Cluster::start();
    let url = cluster.urls()[0].clone();
    let locks = readme_acl_rules("fencelock-locks");
    let ops = readme_acl_rules("fencelock-ops");
    for node in &cluster.nodes {
        set_user_on(node, "fencelock-locks", &locks);
        set_user_on(node, "fencelock-ops", &ops);
    }
    let as_user = |user: &str, args: &[&str]| {
        let output = run(fencelock()
            .env("FENCELOCK_PASSWORD", PASSWORD)
            .args(["--url", &url, "--user", user])
            .args(args));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{user} {args:?}: {}",
            stderr(&output)
        );
        stdout(&output)
    };
    as_user("fencelock-locks", &["exec", "job", "--", "true"]);
    as_user(
        "fencelock-locks",
        &["exec", "--fair", "a", "b", "--", "true"],
    );
    as_user(
        "fencelock-locks",
        &["exec", "--permits", "2", "pool", "--", "true"],
    );
    as_user("fencelock-locks", &["latch", "set", "gate", "1"]);
    assert!(as_user("fencelock-ops", &["list"]).contains("job mutex free"));
    as_user("fencelock-ops", &["top", "--once"]);
    as_user("fencelock-ops", &["status", "--fair", "a"]);
    as_user("fencelock-ops", &["unlock", "--force", "--latch", "gate"]);

    // Without +cluster|info the fence rule cannot read the epoch: named.
    let fewer: Vec<String> = locks
        .iter()
        .filter(|r| *r != "+cluster|info")
        .cloned()
        .collect();
    assert_eq!(fewer.len() + 1, locks.len());
    for node in &cluster.nodes {
        set_user_on(node, "fencelock-locks", &fewer);
    }
    let output = run(fencelock().env("FENCELOCK_PASSWORD", PASSWORD).args([
        "--url",
        &url,
        "--user",
        "fencelock-locks",
        "exec",
        "job",
        "--",
        "true",
    ]));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("may not run CLUSTER INFO from a script (+cluster|info"),
        "{}",
        stderr(&output)
    );
}
