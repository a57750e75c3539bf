//! What TLS to the shared stores shares: the certificates of a CA file,
//! checked when the store is built (a bad file is a start-up error, never
//! a failure on the first request), and the public roots built in
//! (webpki-roots), so that a slim image needs no system certificates.

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The roots of a CA file's PEM: at least one certificate, every one
/// parsed.
pub(crate) fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, String> {
    let certificates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
    if certificates.is_empty() {
        return Err("it holds no PEM certificate".into());
    }
    let mut roots = RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(certificates);
    if unusable > 0 || roots.is_empty() {
        return Err("a certificate in it cannot be parsed".into());
    }
    Ok(roots)
}

/// The crypto of TLS to the stores: ring (rustls 0.23.48 deprecates its
/// provider for want of post-quantum key exchange; aws-lc-rs, which has
/// it, needs CMake and a longer C build, for connections that stay inside
/// a deployment).
#[allow(deprecated)]
pub(crate) fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The public roots (Mozilla's, through webpki-roots).
#[cfg(feature = "postgres")]
pub(crate) fn public_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}
