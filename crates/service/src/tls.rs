//! TLS for the HTTP server (`--tls-cert-file`, `--tls-key-file`): rustls, with the certificate
//! chain and key read from PEM files and read again when either file changes, so that a
//! renewed certificate (cert-manager, certbot) is served without a restart. A reload that
//! fails keeps the last good pair and says why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// How often the files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// The server's TLS settings, as last read from the files.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(TlsAcceptor, Stamp)>,
}

/// What tells a file changed: its modification time and length, of both files.
type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(paths: &[&Path]) -> Stamp {
    paths.iter().map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())))).collect()
}

/// Why a certificate and key do not make a TLS configuration: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{}: not a PEM certificate chain: {error}", path.display())]
    Chain { path: PathBuf, error: pem::Error },
    #[error("{}: no certificate in it", .0.display())]
    NoCertificate(PathBuf),
    #[error("{}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {error}", path.display())]
    Key { path: PathBuf, error: pem::Error },
    #[error("{} and {} do not make a certificate and its key: {error}", cert.display(), key.display())]
    Pair { cert: PathBuf, key: PathBuf, error: tokio_rustls::rustls::Error },
    /// The TLS library refused its own protocol versions: no fault of the files.
    #[error("TLS cannot be set up: {0}")]
    Provider(tokio_rustls::rustls::Error),
}

/// A rustls server configuration of the PEM certificate chain at `cert` and key at `key`.
fn config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let read = |p: &Path| std::fs::read(p).map_err(|error| TlsError::Read { path: p.into(), error });
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|error| TlsError::Chain { path: cert.into(), error })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.into()));
    }
    let key_der =
        PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|error| TlsError::Key { path: key.into(), error })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Provider)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|error| TlsError::Pair { cert: cert.into(), key: key.into(), error })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl Tls {
    /// The TLS of `vigil serve` when both files are given, watched for changes from now on.
    pub fn serve(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<Arc<Tls>>, TlsError> {
        let (Some(cert), Some(key)) = (cert, key) else { return Ok(None) };
        let tls = Tls::load(cert, key)?;
        tokio::spawn(tls.clone().watch());
        Ok(Some(tls))
    }

    /// Reads the pair; an error says which file and why.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Tls>, TlsError> {
        let acceptor = TlsAcceptor::from(Arc::new(config(cert, key)?));
        let stamp = stamp(&[cert, key]);
        Ok(Arc::new(Tls { cert: cert.into(), key: key.into(), current: RwLock::new((acceptor, stamp)) }))
    }

    /// The acceptor of the pair last read.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().expect("tls").0.clone()
    }

    /// Reads the pair again when a file changed; a pair that does not load is not taken.
    fn reload_if_changed(&self) {
        let now = stamp(&[&self.cert, &self.key]);
        if self.current.read().expect("tls").1 == now {
            return;
        }
        match config(&self.cert, &self.key) {
            Ok(c) => {
                *self.current.write().expect("tls") = (TlsAcceptor::from(Arc::new(c)), now);
                tracing::info!(cert = %self.cert.display(), "TLS certificate read again");
            }
            Err(e) => {
                // Kept until the files change again: a half-written renewal is tried once more then.
                self.current.write().expect("tls").1 = now;
                tracing::error!(error = %e, "the changed TLS files do not load; the last good certificate is served");
            }
        }
    }

    /// Looks at the files every few seconds, for as long as the server runs.
    pub async fn watch(self: Arc<Self>) {
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let tls = self.clone();
            let _ = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
        }
    }
}
