//! `rediss://`: rustls (ring) under redis-rs, the server checked against a
//! CA file when one is given, else the bundled public roots.

use ::redis::{ConnectionAddr, ConnectionInfo, TlsCertificates};

use crate::storage::StorageError;

/// Whether `info` asks for TLS (`rediss://`).
pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// Makes ring the process's rustls provider, unless the application
/// installed one: redis-rs builds its TLS configuration on the default.
pub(super) fn install_provider() {
    // An error means a provider is installed already: that one is used.
    let _ = crate::tls::ring_provider().install_default();
}

/// The certificates of a CA file's PEM, checked now: a start-up error,
/// never a failure on the first request.
pub(super) fn certificates(
    ca_pem: &[u8],
) -> Result<TlsCertificates, StorageError> {
    crate::tls::roots_from_pem(ca_pem).map_err(|why| invalid_ca(&why))?;
    install_provider();
    Ok(TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem.to_vec()),
    })
}

fn invalid_ca(why: &str) -> StorageError {
    StorageError::Backend(format!("Redis CA certificate: {why}").into())
}

/// A CA file given for a URL without TLS.
pub(super) fn needs_rediss() -> StorageError {
    StorageError::Backend(
        "a Redis CA certificate needs a rediss:// URL (TLS)".into(),
    )
}
