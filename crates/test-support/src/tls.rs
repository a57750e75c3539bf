//! [`TestCa`]: a certificate authority made by a test, for a test: a CA,
//! and a server certificate it signed for loopback (`localhost`,
//! `127.0.0.1`), written as PEM files in a directory of their own. Nothing
//! is committed; each run makes new keys.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

use crate::{Error, Result};

/// A throwaway CA and the loopback server certificate it signed; its
/// directory is removed on drop.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    ca_pem: String,
}

impl TestCa {
    /// Makes a CA and a server certificate for `localhost` and
    /// `127.0.0.1`, in a new temporary directory.
    ///
    /// # Errors
    ///
    /// A key or certificate that cannot be made or written.
    pub fn generate() -> Result<TestCa> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::new(format!("test CA: {what}: {e}"))
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| fail("CA parameters", &e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().map_err(|e| fail("CA key", &e))?;
        let ca = ca_params
            .self_signed(&ca_key)
            .map_err(|e| fail("CA certificate", &e))?;
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let server_params = CertificateParams::new(names)
            .map_err(|e| fail("server parameters", &e))?;
        let server_key =
            KeyPair::generate().map_err(|e| fail("server key", &e))?;
        let server = server_params
            .signed_by(&server_key, &ca, &ca_key)
            .map_err(|e| fail("server certificate", &e))?;

        let dir = std::env::temp_dir().join(crate::unique("trt-tls"));
        std::fs::create_dir_all(&dir).map_err(|e| fail("directory", &e))?;
        let made = TestCa {
            dir,
            ca_pem: ca.pem(),
        };
        for (path, text) in [
            (made.ca_file(), ca.pem()),
            (made.cert_file(), server.pem()),
            (made.key_file(), server_key.serialize_pem()),
        ] {
            std::fs::write(&path, text)
                .map_err(|e| fail(&path.display().to_string(), &e))?;
        }
        Ok(made)
    }

    /// The CA's certificate, PEM: what a client trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA's certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server's certificate file (signed by the CA).
    pub fn cert_file(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server's private key file.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The directory of the three files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
