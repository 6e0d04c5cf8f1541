//! The passwords this run knows (from `--password-file`, `FENCELOCK_PASSWORD` and the URLs),
//! replaced by `***` in every message and log line fencelock prints.

use std::io::Write;
use std::sync::Mutex;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Redacts `secret` from now on.
pub fn remember(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_owned());
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// Redacts the password of `url` (`scheme://[user]:PASSWORD@host...`), as written and
/// percent-decoded, from now on.
pub fn remember_url(url: &str) {
    let Some(rest) = url.split_once("://").map(|(_, rest)| rest) else {
        return;
    };
    let Some((userinfo, _)) = rest.rsplit_once('@') else {
        return;
    };
    if let Some((_, password)) = userinfo.split_once(':') {
        remember(password);
        remember(&percent_decode(password));
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with every known password replaced by `***`.
pub fn redact(text: &str) -> String {
    let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = text.to_owned();
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// Standard error with known passwords redacted: the `tracing` events' writer (each event
/// arrives in one write). An event that cannot be written (stderr closed) is dropped, as `say!`
/// drops a message: reported as an error, `tracing` would print it with `eprintln!`, which
/// panics there.
pub struct RedactingStderr;

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = redact(&String::from_utf8_lossy(buf));
        let _ = std::io::stderr().write_all(text.as_bytes());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_redacted_as_written_and_decoded() {
        remember_url("redis://admin:p%40ss@host:1");
        remember_url("redis://host:2");
        assert_eq!(redact("a p@ss b p%40ss"), "a *** b ***");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
