//! Probing the seeds: which of them answer and whether they run in cluster mode, and telling
//! why a connection failed (a DNS failure, a refused connection, a TLS mismatch, refused
//! credentials) apart for [`Error::Connect`].

use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncConnectionConfig, ConnectionInfo, RedisError};

use crate::error::{Error, Result};
use crate::human::HumanDuration;

use super::connection::{Timeouts, Topology};
use super::tls;

/// After the first seed answers, how long the others get to answer too.
const PROBE_GRACE: Duration = Duration::from_millis(25);

/// Probes every seed at once. Returns the topology and the seeds that answered (the first, and
/// any others within [`PROBE_GRACE`] of it), or, when none did, the most telling failure. A
/// refusal that every node would give alike (refused credentials, a failed TLS handshake, an
/// ACL user that may not run the probe) is returned at once, as no other seed will fare better;
/// any other failure concerns that node alone (`BUSY` running a long script, `LOADING` its
/// dataset, `MASTERDOWN`, a reply that is not the Redis protocol because the URL names another
/// service, no answer at all), so the other seeds are awaited, and when none answers either, a
/// node that answered with an error is reported rather than one that did not answer.
pub(super) async fn probe_all(
    seeds: &[ConnectionInfo],
    timeouts: Timeouts,
    nodes: &str,
) -> Result<(Topology, Vec<ConnectionInfo>)> {
    let mut probes = tokio::task::JoinSet::new();
    for seed in seeds {
        let seed = seed.clone();
        probes.spawn(async move {
            let outcome = probe(&seed, timeouts).await;
            (seed, outcome)
        });
    }
    let (mut topology, mut live, mut failure) = (None, Vec::new(), None);
    let mut grace_end = None;
    loop {
        let joined = match grace_end {
            Some(end) => match tokio::time::timeout_at(end, probes.join_next()).await {
                Ok(joined) => joined,
                Err(_) => break,
            },
            None => probes.join_next().await,
        };
        let Some(joined) = joined else { break };
        let Ok((seed, outcome)) = joined else {
            continue;
        };
        match outcome {
            Ok(found) => {
                topology.get_or_insert(found);
                live.push(seed);
                grace_end.get_or_insert(tokio::time::Instant::now() + PROBE_GRACE);
            }
            Err(err) if live.is_empty() && is_refusal(&err) => return Err(err),
            Err(err) => match &failure {
                Some(known) if answered(known) || !answered(&err) => {}
                _ => failure = Some(err),
            },
        }
    }
    match topology {
        Some(topology) => Ok((topology, live)),
        None => Err(failure.unwrap_or_else(|| Error::Connect {
            target: nodes.to_owned(),
            reason: "no node answered".into(),
            source: None,
        })),
    }
}

/// Asks one node whether it runs in cluster mode.
async fn probe(info: &ConnectionInfo, timeouts: Timeouts) -> Result<Topology> {
    let target = info.addr().to_string();
    match ask_topology(info, timeouts).await {
        Ok(Ok(topology)) => Ok(topology),
        Ok(Err(source)) if is_auth_failure(&source) && no_password_set(info, timeouts).await => {
            Err(Error::Connect {
                target,
                reason: "authentication failed: the server has no password set, and one was \
                         given: leave the password out (the URL's, or the client's setting), or \
                         set one on the server"
                    .into(),
                source: Some(source),
            })
        }
        Ok(Err(source)) => Err(connect_error(&target, source, is_tls(info))),
        Err(deadline) => Err(Error::Connect {
            target,
            reason: format!(
                "no answer within {}: is Redis running there?",
                HumanDuration(deadline)
            ),
            source: None,
        }),
    }
}

/// Whether `info`'s password was refused because the server has none: it was given for the
/// default user, and the node answers without it.
async fn no_password_set(info: &ConnectionInfo, timeouts: Timeouts) -> bool {
    let settings = info.redis_settings();
    if settings.password().is_none() || settings.username().is_some_and(|u| u != "default") {
        return false;
    }
    let bare = redis::RedisConnectionInfo::default().set_protocol(settings.protocol());
    let without = info.clone().set_redis_settings(bare);
    matches!(ask_topology(&without, timeouts).await, Ok(Ok(_)))
}

/// `INFO cluster` on one node: its topology, the error, or (`Err`) the deadline that passed.
async fn ask_topology(
    info: &ConnectionInfo,
    timeouts: Timeouts,
) -> std::result::Result<std::result::Result<Topology, RedisError>, Duration> {
    let attempt = async {
        let client = redis::Client::open(info.clone())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut conn)
            .await
    };
    let deadline = timeouts.connect + timeouts.response;
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(info)) if info.contains("cluster_enabled:1") => Ok(Ok(Topology::Cluster)),
        Ok(Ok(_)) => Ok(Ok(Topology::Standalone)),
        Ok(Err(source)) => Ok(Err(source)),
        Err(_) => Err(deadline),
    }
}

fn is_auth_failure(source: &RedisError) -> bool {
    source.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("NOAUTH" | "WRONGPASS"))
}

pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// The [`Error::Connect`] for a failed connection to `target` (`tls`: over `rediss://`): the
/// reason tells a DNS failure, a refused connection, a TLS mismatch (a plain URL for a TLS
/// port, `rediss://` for a plain one), a failed handshake and refused credentials apart and
/// does not repeat `source`'s text, which the error's `source()` carries.
pub(super) fn connect_error(target: &str, source: RedisError, tls: bool) -> Error {
    Error::Connect {
        target: target.to_owned(),
        reason: connect_reason(&source, tls).to_owned(),
        source: Some(source),
    }
}

fn connect_reason(source: &RedisError, tls: bool) -> &'static str {
    use std::io::ErrorKind;
    if let Some(reason) = tls::failure(source) {
        return reason;
    }
    if is_auth_failure(source) {
        return "authentication failed: check the user name and password";
    }
    let io = io_error(source);
    // std's resolver errors say so on every platform; redis-rs keeps only the text of some.
    let text = source.to_string();
    if text.contains("lookup address information") || text.contains("no address") {
        return "the host name could not be resolved (DNS): check the host name in the URL";
    }
    match io.map(std::io::Error::kind) {
        Some(ErrorKind::ConnectionRefused) => {
            "connection refused: nothing listens on that port; is Redis running there?"
        }
        // A TLS port closes a connection that does not start a TLS handshake.
        Some(ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe)
            if !tls =>
        {
            "the server closed the connection at once: if that port speaks TLS, use a rediss:// \
             URL"
        }
        // A plain port reads the TLS handshake as a command and waits for the rest of it.
        Some(ErrorKind::TimedOut | ErrorKind::WouldBlock) if tls => {
            "no answer to the TLS handshake: if that port speaks plain Redis (no TLS), use a \
             redis:// URL; else is Redis running there?"
        }
        Some(ErrorKind::TimedOut | ErrorKind::WouldBlock) => "no answer: is Redis running there?",
        Some(_) if tls => "the TLS connection failed: is it a TLS port, and Redis running there?",
        Some(_) => "the connection failed: is Redis running there?",
        None if source.is_timeout() => "no answer: is Redis running there?",
        None if source.is_io_error() || source.is_connection_refusal() => {
            "the connection failed: is Redis running there?"
        }
        None if source.kind() == redis::ErrorKind::Parse => {
            "the server's answer is not the Redis protocol: is that port Redis's (not HTTP or \
             another service)?"
        }
        None => match source.code() {
            Some("BUSY") => {
                "the server is busy running a script or function (BUSY): wait for it, or end it \
                 with SCRIPT KILL / FUNCTION KILL"
            }
            Some("LOADING") => {
                "the server is loading its data set (LOADING): try again when it is done"
            }
            Some("MASTERDOWN") => "the replica has lost its master and does not serve (MASTERDOWN)",
            Some("NOPERM") => {
                "the ACL user may not run INFO, which the connection needs: grant it (+info)"
            }
            _ => "the server refused the connection",
        },
    }
}

/// The I/O error `source` is or wraps.
fn io_error(source: &RedisError) -> Option<&std::io::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        if let Some(shared) = err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
            next = Some(shared.as_ref());
            continue;
        }
        next = err.source();
    }
    None
}

/// A node said no in a way every node of the deployment would: refused credentials, a failed
/// TLS handshake (the same certificates and settings go to every node), or `NOPERM` (the ACL
/// user may not run the probe's command, and a deployment's nodes are given the same ACLs).
/// Other errors a node answers (`BUSY`, `LOADING`, `MASTERDOWN`, a reply that is not the Redis
/// protocol) concern that node alone.
fn is_refusal(err: &Error) -> bool {
    matches!(err, Error::Connect { source: Some(s), .. }
        if is_auth_failure(s) || tls::failure(s).is_some() || s.code() == Some("NOPERM"))
}

/// Whether the node answered (with an error), as opposed to not being reached or not answering.
fn answered(err: &Error) -> bool {
    matches!(err, Error::Connect { source: Some(s), .. }
        if !(s.is_connection_refusal() || s.is_io_error() || s.is_timeout()))
}

#[cfg(test)]
mod tests {
    use redis::{RedisError, Value};

    use super::{answered, connect_error, is_refusal};
    use crate::error::Error;

    /// The error a server's reply line `-…` becomes, as the probe sees it.
    fn replied(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(Value::ServerError(error)) => RedisError::from(error),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn only_what_every_node_would_answer_is_final() {
        let final_ = [
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOAUTH Authentication required.",
            "NOPERM this user has no permissions to run the 'info' command",
        ];
        for line in final_ {
            let err = connect_error("n:1", replied(line), false);
            assert!(is_refusal(&err), "{line}");
        }
        let of_that_node = [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "ERR unknown command 'INFO'",
        ];
        for line in of_that_node {
            let err = connect_error("n:1", replied(line), false);
            assert!(!is_refusal(&err) && answered(&err), "{line}");
        }
        // The reason names the state the node is in.
        for (line, named) in of_that_node
            .iter()
            .zip(["(BUSY)", "(LOADING)", "(MASTERDOWN)"])
        {
            let Error::Connect { reason, .. } = connect_error("n:1", replied(line), false) else {
                panic!("not a connect error");
            };
            assert!(reason.contains(named), "{line}: {reason}");
        }
        // Not the Redis protocol (another service on that port): that node alone.
        let foreign = redis::parse_redis_value(b"HTTP/1.1 400 Bad Request\r\n").unwrap_err();
        let err = connect_error("n:1", foreign, false);
        assert!(!is_refusal(&err) && answered(&err), "{err:?}");
        // Not reached: neither final nor an answer.
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = connect_error("n:1", RedisError::from(refused), false);
        assert!(!is_refusal(&err) && !answered(&err), "{err:?}");
    }
}
