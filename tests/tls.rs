//! `vigil serve` over TLS (`--tls-cert-file`, `--tls-key-file`): HTTPS with a certificate made
//! by OpenSSL, read again when the files change, and refused at start with the reason when the
//! pair does not load.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

/// A self-signed certificate for 127.0.0.1 and its key, written by the `openssl` command.
fn certificate(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=vigil-test", "-addext", "subjectAltName=IP:127.0.0.1"])
        // A server's certificate, not an authority's (webpki refuses an authority's as a server's).
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command runs (Debian's openssl package)");
    assert!(status.success(), "openssl made a certificate");
    (cert, key)
}

/// A client that trusts only `cert`.
fn trusting(cert: &Path) -> reqwest::Client {
    let pem = std::fs::read(cert).expect("certificate");
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("PEM"))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

#[tokio::test]
async fn https_is_served_and_a_renewed_certificate_is_taken_without_a_restart() {
    let dir = temp_dir("tls");
    let (cert, key) = certificate(&dir, "first");
    let (served_cert, served_key) = (dir.join("served.crt"), dir.join("served.key"));
    std::fs::copy(&cert, &served_cert).expect("copy");
    std::fs::copy(&key, &served_key).expect("copy");
    let rules = rules_dir();
    let (c, k) = (served_cert.display().to_string(), served_key.display().to_string());
    let service = Service::start(&[
        "--rules",
        &rules,
        "--database-url",
        &sqlite_url(&dir),
        "--api-token",
        "s3cret",
        "--tls-cert-file",
        &c,
        "--tls-key-file",
        &k,
    ]);
    assert!(service.url.starts_with("https://"), "{}", service.url);
    let first = trusting(&cert);
    let health = first.get(format!("{}/healthz", service.url)).send().await.expect("HTTPS answers");
    assert_eq!(health.status(), 200);
    // A collector sends across the network with its token: line protocol over HTTPS.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let write = first
        .post(format!("{}/api/v2/write?precision=s", service.url))
        .bearer_auth("s3cret")
        .body(format!("cpu,host=web-1 usage_user=12.5 {now}\n"))
        .send()
        .await
        .expect("HTTPS answers");
    assert_eq!(write.status(), 204);
    // Plain HTTP on the TLS port gets no answer.
    let plain = service.url.replace("https://", "http://");
    assert!(reqwest::get(format!("{plain}/healthz")).await.is_err(), "plain HTTP is not served");

    // The certificate is renewed in place: new connections get the new one.
    let (renewed, renewed_key) = certificate(&dir, "second");
    std::fs::copy(&renewed_key, &served_key).expect("copy");
    std::fs::copy(&renewed, &served_cert).expect("copy");
    let second = trusting(&renewed);
    eventually("the renewed certificate served", || async {
        second.get(format!("{}/healthz", service.url)).send().await.ok().filter(|r| r.status() == 200)
    })
    .await;
    let old = trusting(&cert);
    assert!(old.get(format!("{}/healthz", service.url)).send().await.is_err(), "the old certificate is gone");
    // A half-written renewal is not taken: the last good certificate goes on being served.
    std::fs::write(&served_cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").expect("write");
    eventually("the half-written certificate refused", || async {
        service.log().contains("the changed TLS files do not load").then_some(())
    })
    .await;
    let still = second.get(format!("{}/healthz", service.url)).send().await.expect("still served");
    assert_eq!(still.status(), 200);
    drop(service);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_certificate_and_key_that_do_not_load_stop_the_start_with_the_reason() {
    let dir = temp_dir("tls_bad");
    let (cert, _) = certificate(&dir, "one");
    let (_, other_key) = certificate(&dir, "two");
    let rules = rules_dir();
    let db = sqlite_url(&dir);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--http-addr", "127.0.0.1:0", "--rules", &rules, "--database-url", &db])
            .arg("--spool-dir")
            .arg(dir.join("spool"))
            .arg("--ingest-log-dir")
            .arg(dir.join("ingest"))
            .args(args)
            .output()
            .expect("vigil runs");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (c, k) = (cert.display().to_string(), other_key.display().to_string());
    let (ok, err) = run(&["--tls-cert-file", &c, "--tls-key-file", &k]);
    assert!(!ok && err.contains("do not make a certificate and its key"), "{err}");
    let (ok, err) = run(&["--tls-cert-file", &c]);
    assert!(!ok && err.contains("--tls-cert-file needs --tls-key-file"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
