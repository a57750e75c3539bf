//! TLS to PostgreSQL: the connection string's `sslmode` and `sslrootcert`,
//! read before tokio-postgres reads the rest (it knows neither
//! `verify-full` nor `sslrootcert`).
//!
//! | `sslmode` | here |
//! |---|---|
//! | absent, `disable`, `prefer` | no TLS (as without this module) |
//! | `require`, `verify-ca`, `verify-full` | TLS, the certificate checked: its chain against `sslrootcert` (else the public roots), and its name against the host |
//!
//! `require` and `verify-ca` check more than libpq does (libpq's `require`
//! checks nothing without a root file, `verify-ca` not the name): a
//! limiter's store is not a place for a certificate nobody checked. A
//! managed database whose CA is its provider's (RDS, Cloud SQL) needs
//! that CA as `sslrootcert`.

use std::sync::Arc;

use rustls::ClientConfig;

/// What the connection string asks of TLS.
#[derive(Debug, Clone)]
pub(super) struct Tls {
    /// The connector's configuration; `None`: no TLS.
    pub(super) config: Option<Arc<ClientConfig>>,
}

/// Splits `url` into what tokio-postgres reads and the TLS it asks for,
/// the root file read now.
pub(super) fn split(url: &str) -> Result<(String, Tls), String> {
    let (mut kept, mut mode, mut root) = (String::new(), None, None);
    let url_form =
        url.starts_with("postgres://") || url.starts_with("postgresql://");
    if url_form {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut params = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", value)) => mode = Some(value.to_owned()),
                Some(("sslrootcert", value)) => root = Some(decode(value)?),
                _ => params.push(pair),
            }
        }
        kept.push_str(base);
        if let Some(tls_mode) = tokio_mode(mode.as_deref())? {
            params.push(tls_mode);
        }
        if !params.is_empty() {
            kept.push('?');
            kept.push_str(&params.join("&"));
        }
    } else {
        let mut words = Vec::new();
        for word in url.split_whitespace() {
            match word.split_once('=') {
                Some(("sslmode", value)) => mode = Some(value.to_owned()),
                Some(("sslrootcert", value)) => root = Some(value.to_owned()),
                _ => words.push(word.to_owned()),
            }
        }
        if let Some(tls_mode) = tokio_mode(mode.as_deref())? {
            words.push(tls_mode.to_owned());
        }
        kept = words.join(" ");
    }
    let verify = matches!(
        mode.as_deref(),
        Some("require" | "verify-ca" | "verify-full")
    );
    if root.is_some() && !verify {
        return Err(
            "sslrootcert needs sslmode=require, verify-ca or verify-full"
                .into(),
        );
    }
    let config = verify.then(|| client_config(root.as_deref())).transpose()?;
    Ok((kept, Tls { config }))
}

/// tokio-postgres's own `sslmode` for ours.
fn tokio_mode(mode: Option<&str>) -> Result<Option<&'static str>, String> {
    Ok(match mode {
        None => None,
        Some("disable") => Some("sslmode=disable"),
        Some("prefer") => Some("sslmode=prefer"),
        Some("require" | "verify-ca" | "verify-full") => {
            Some("sslmode=require")
        }
        Some(other) => {
            return Err(format!(
                "sslmode={other}: expected disable, prefer, require, verify-ca or verify-full"
            ));
        }
    })
}

/// rustls, with ring, over the roots of `root_file` or the public ones.
fn client_config(root_file: Option<&str>) -> Result<Arc<ClientConfig>, String> {
    let roots = match root_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            crate::tls::roots_from_pem(&pem)
                .map_err(|why| format!("sslrootcert {path}: {why}"))?
        }
        None => crate::tls::public_roots(),
    };
    let provider = Arc::new(crate::tls::ring_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A URL query value, percent-decoded (a path may hold `%2F`).
fn decode(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = value
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        format!("sslrootcert {value:?}: a bad %-escape")
                    })?;
                out.push(hex);
                i += 3;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| format!("sslrootcert {value:?}: not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn the_modes_and_what_tokio_postgres_is_given() {
        for (url, kept, tls) in [
            ("postgres://app@db/app", "postgres://app@db/app", false),
            (
                "postgres://app@db/app?sslmode=disable",
                "postgres://app@db/app?sslmode=disable",
                false,
            ),
            (
                "postgres://app@db/app?sslmode=prefer",
                "postgres://app@db/app?sslmode=prefer",
                false,
            ),
            (
                "postgres://app@db/app?application_name=x&sslmode=verify-full",
                "postgres://app@db/app?application_name=x&sslmode=require",
                true,
            ),
            (
                "postgresql://db/app?sslmode=require",
                "postgresql://db/app?sslmode=require",
                true,
            ),
            (
                "host=db user=app sslmode=verify-ca",
                "host=db user=app sslmode=require",
                true,
            ),
        ] {
            let (got, settings) = split(url).unwrap();
            assert_eq!(got, kept, "{url}");
            assert_eq!(settings.config.is_some(), tls, "{url}");
            got.parse::<tokio_postgres::Config>().unwrap();
        }
    }

    #[test]
    fn bad_settings_are_errors_that_name_them() {
        for (url, needle) in [
            (
                "postgres://db/app?sslmode=allow-anything",
                "sslmode=allow-anything",
            ),
            ("postgres://db/app?sslrootcert=/ca.pem", "sslrootcert needs"),
            (
                "postgres://db/app?sslmode=verify-full&sslrootcert=/nonexistent.pem",
                "/nonexistent.pem",
            ),
            (
                "postgres://db/app?sslmode=require&sslrootcert=%zz",
                "%-escape",
            ),
        ] {
            let error = split(url).unwrap_err();
            assert!(error.contains(needle), "{url}: {error}");
        }
    }
}
