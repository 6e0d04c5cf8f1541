//! TLS for `rediss://` URLs: the crypto provider, the CA and client certificate files, and
//! telling TLS failures apart from other connection failures.
//!
//! redis-rs builds a rustls `ClientConfig` for every TLS connection it opens with
//! `ClientConfig::builder()`, which uses rustls' process-level default crypto provider and
//! panics when none is installed and rustls cannot pick one from its crate features (none or
//! both of `ring` and `aws-lc-rs` enabled). [`prepare`] therefore installs ring as the default
//! before fencelock opens its first TLS connection, unless the application installed one.

use std::path::PathBuf;

use redis::{ConnectionAddr, ConnectionInfo, RedisError};

use crate::error::{Error, Result};

/// The TLS files a [`ClientBuilder`](crate::ClientBuilder) names; read at `connect`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsFiles {
    /// PEM bundle of CA certificates to trust instead of the platform's roots.
    pub(crate) ca: Option<PathBuf>,
    /// PEM client certificate chain and PEM private key, for mutual TLS.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    fn describe(&self) -> &'static str {
        match (&self.ca, &self.client) {
            (Some(_), Some(_)) => "a TLS CA file and a client certificate",
            (Some(_), None) => "a TLS CA file",
            _ => "a TLS client certificate",
        }
    }
}

/// The certificates every connection of one client applies.
#[cfg(feature = "tls")]
pub(crate) type Certs = redis::TlsCertificates;

/// Without the `tls` feature there are never certificates to apply.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub(crate) enum Certs {}

/// Checks the TLS settings against the URLs, installs the crypto provider when a URL uses TLS
/// and reads the files. Returns the certificates to apply to every connection, if any were set.
pub(crate) fn prepare(files: &TlsFiles, seeds: &[ConnectionInfo]) -> Result<Option<Certs>> {
    let uses_tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if !files.is_empty() {
        if !cfg!(feature = "tls") {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{} was given, but this fencelock was built without TLS: enable its `tls` \
                     feature",
                    files.describe()
                ),
            });
        }
        if let Some(plain) = seeds.iter().find(|info| !uses_tls(info)) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{} was given, but {} is a plain redis:// URL: use rediss:// for TLS, or \
                     drop the TLS settings",
                    files.describe(),
                    plain.addr()
                ),
            });
        }
    }
    if !seeds.iter().any(uses_tls) {
        return Ok(None);
    }
    imp::install_provider();
    imp::load(files)
}

/// Installs the crypto provider (when the `tls` feature is on and the application installed
/// none), for connections whose TLS settings fencelock cannot see (a given cluster client).
pub(crate) fn ensure_provider() {
    imp::install_provider();
}

/// `info` with the certificates attached, so connections opened from it use them.
pub(crate) fn apply(info: ConnectionInfo, certs: Option<&Certs>) -> Result<ConnectionInfo> {
    match certs {
        None => Ok(info),
        #[cfg(feature = "tls")]
        Some(certs) => {
            let target = info.addr().to_string();
            redis::Client::build_with_tls(info, certs.clone())
                .map(|client| client.get_connection_info().clone())
                .map_err(|e| Error::InvalidConfig {
                    reason: format!("cannot set up TLS for {target}: {e}"),
                })
        }
        #[cfg(not(feature = "tls"))]
        Some(certs) => match *certs {},
    }
}

/// `builder` with the certificates set for every node the cluster connection finds.
pub(crate) fn apply_to_cluster(
    builder: redis::cluster::ClusterClientBuilder,
    certs: Option<&Certs>,
) -> redis::cluster::ClusterClientBuilder {
    match certs {
        None => builder,
        #[cfg(feature = "tls")]
        Some(certs) => builder.certs(certs.clone()),
        #[cfg(not(feature = "tls"))]
        Some(certs) => match *certs {},
    }
}

/// What went wrong in a TLS handshake, when `source` is a TLS failure: a reason for
/// [`Error::Connect`] that says what to check.
pub(crate) fn failure(source: &RedisError) -> Option<&'static str> {
    imp::failure(source)
}

#[cfg(feature = "tls")]
mod imp {
    use std::error::Error as StdError;
    use std::path::Path;
    use std::sync::Arc;

    use redis::{ClientTlsConfig, RedisError, TlsCertificates};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{AlertDescription, RootCertStore};

    use super::TlsFiles;
    use crate::error::{Error, Result};

    fn file_error(what: &str, path: &Path, problem: impl std::fmt::Display) -> Error {
        Error::InvalidConfig {
            reason: format!("the TLS {what} file {}: {problem}", path.display()),
        }
    }

    /// Makes ring rustls' process-level default crypto provider unless one is installed
    /// already (by the application, or by an earlier call): that one is kept.
    pub(super) fn install_provider() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err means another thread installed one first: it stays, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }

    /// Reads and checks the files; `None` when none are set (redis-rs then trusts the
    /// platform's roots and presents no client certificate).
    pub(super) fn load(files: &TlsFiles) -> Result<Option<TlsCertificates>> {
        if files.is_empty() {
            return Ok(None);
        }
        let mut roots = RootCertStore::empty();
        let root_cert = match &files.ca {
            Some(path) => {
                let pem = read("CA", path)?;
                for (n, cert) in certificates("CA", path, &pem)?.into_iter().enumerate() {
                    roots.add(cert).map_err(|e| {
                        file_error(
                            "CA",
                            path,
                            format!("certificate {} is not a usable CA certificate ({e})", n + 1),
                        )
                    })?;
                }
                Some(pem)
            }
            None => None,
        };
        let client_tls = match &files.client {
            Some((cert_path, key_path)) => {
                let client_cert = read("client certificate", cert_path)?;
                let chain = certificates("client certificate", cert_path, &client_cert)?;
                let client_key = read("client key", key_path)?;
                let key = PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| {
                    file_error(
                        "client key",
                        key_path,
                        format!(
                            "no usable PEM private key in it ({e}): expected a BEGIN PRIVATE \
                             KEY, RSA PRIVATE KEY or EC PRIVATE KEY block"
                        ),
                    )
                })?;
                // The same check rustls makes when redis-rs connects, made now to name the files.
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .and_then(|b| {
                        b.with_root_certificates(roots)
                            .with_client_auth_cert(chain, key)
                    })
                    .map_err(|e| {
                        file_error(
                            "client certificate",
                            cert_path,
                            format!(
                                "cannot be used with the key in {} ({e}): check that they \
                                 belong together",
                                key_path.display()
                            ),
                        )
                    })?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            None => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    fn read(what: &str, path: &Path) -> Result<Vec<u8>> {
        std::fs::read(path).map_err(|e| file_error(what, path, format!("cannot be read ({e})")))
    }

    /// The certificates in a PEM file; at least one.
    fn certificates(what: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| file_error(what, path, format!("is not valid PEM ({e})")))?;
        if certs.is_empty() {
            return Err(file_error(
                what,
                path,
                "holds no PEM certificate (no BEGIN CERTIFICATE block)",
            ));
        }
        Ok(certs)
    }

    pub(super) fn failure(source: &RedisError) -> Option<&'static str> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(source);
        while let Some(err) = next {
            if let Some(tls) = rustls_error(err) {
                return Some(reason(tls));
            }
            next = err.source();
        }
        // A cluster connection that could reach none of its nodes keeps only the text of
        // their errors; rustls' messages begin like this.
        let text = source.to_string();
        if text.contains("invalid peer certificate") {
            Some(UNTRUSTED)
        } else if text.contains("received fatal alert") || text.contains("peer is incompatible") {
            Some(OTHER)
        } else {
            None
        }
    }

    const UNTRUSTED: &str = "TLS handshake failed: the server's certificate is not trusted: \
                             check the CA file (tls_ca_file) and the server certificate's names";
    const CLIENT_CERT: &str = "TLS handshake failed: the server did not accept the client \
                               certificate: check the client certificate and key files \
                               (tls_client_cert_files)";
    const OTHER: &str = "TLS handshake failed: check that the port speaks TLS, the CA file \
                         (tls_ca_file) and the server certificate";

    /// The rustls error `err` is or wraps: redis-rs keeps I/O errors as
    /// `Arc<dyn Error>`, and tokio-rustls hands rustls errors over inside an `io::Error`.
    fn rustls_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.get_ref().and_then(|inner| inner.downcast_ref());
        }
        if let Some(shared) = err.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
            let inner: &(dyn StdError + 'static) = shared.as_ref();
            return rustls_error(inner);
        }
        None
    }

    fn reason(err: &rustls::Error) -> &'static str {
        match err {
            rustls::Error::InvalidCertificate(_) => UNTRUSTED,
            rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::UnsupportedCertificate,
            ) => CLIENT_CERT,
            _ => OTHER,
        }
    }
}

#[cfg(not(feature = "tls"))]
mod imp {
    use redis::RedisError;

    use super::{Certs, TlsFiles};
    use crate::error::Result;

    pub(super) fn install_provider() {}

    pub(super) fn load(_: &TlsFiles) -> Result<Option<Certs>> {
        Ok(None)
    }

    pub(super) fn failure(_: &RedisError) -> Option<&'static str> {
        None
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::sync::Arc;

    use rustls::crypto::CryptoProvider;

    #[test]
    fn tls_failures_are_told_apart() {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, untrusted);
        let reason = super::failure(&redis::RedisError::from(wrapped)).expect("a TLS failure");
        assert!(reason.contains("not trusted"), "{reason}");
        // What a cluster connection keeps of its nodes' errors: their text.
        let summary = redis::RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "Io: invalid peer certificate: UnknownIssuer".to_owned(),
        ));
        assert_eq!(super::failure(&summary), Some(reason));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(super::failure(&redis::RedisError::from(refused)), None);
    }

    /// The only test in this binary that touches the process-level provider.
    #[test]
    fn an_installed_provider_is_kept() {
        // The application's own choice, made before it connects.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let installed = Arc::clone(CryptoProvider::get_default().expect("installed"));
        super::imp::install_provider();
        let after = CryptoProvider::get_default().expect("still installed");
        assert!(
            Arc::ptr_eq(&installed, after),
            "the application's provider stays"
        );
    }
}
