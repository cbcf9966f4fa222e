//! The cluster's certificates: one CA, a server certificate per node (server authentication
//! only) and one client certificate for the balancer (client authentication only), written by
//! `blindfold cluster-certs`.
//!
//! ```text
//! <out>/ca/cert.pem, key.pem          the cluster CA (keep key.pem offline once done)
//! <out>/node-<i>/ca.pem, cert.pem, key.pem   for `blindfold node --tls-dir <out>/node-<i>`
//! <out>/balancer/ca.pem, cert.pem, key.pem, node-names
//!                                     for `blindfold serve --nodes … --tls-dir <out>/balancer`
//! ```
//!
//! Every node's certificate names the node, not its host: node `i` is `node-<i>.blindfold`
//! ([`node_name`]), its only subject alternative name, so two nodes on one host hold
//! certificates for different names. The balancer's directory lists the names
//! (`node-names`). The balancer learns which node answers at an address by the name its
//! certificate proves (a TLS handshake that expects that name: only the holder of the node's
//! key completes it), refuses two addresses that prove the same name, and checks on every
//! start that each name still holds the data it held before (see
//! [`crate::balancer::Balancer::open`]); so no node can stand in for another.
//!
//! A node trusts only the cluster CA for client certificates and requires one; the balancer
//! trusts only the cluster CA for server certificates. rustls checks the extended key usage,
//! so a node's certificate cannot act as the balancer and the balancer's cannot act as a node.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::NodeError;

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> NodeError + '_ {
    move |e| NodeError::Tls(format!("{what}: {e}"))
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> NodeError + '_ {
    move |e| NodeError::Io { path: path.to_path_buf(), source: e }
}

/// Creates `dir` private (0700); refuses one that exists.
fn new_private_dir(dir: &Path) -> Result<(), NodeError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.exists() {
        return Err(NodeError::Config(format!(
            "{} exists: cluster-certs never overwrites certificates (choose another --out)",
            dir.display()
        )));
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))
}

/// Writes `bytes` to a new file `path`, mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(io_err(path))
}

/// The host of a `--nodes` entry: `host`, `host:port`, `[v6]:port` or `https://host:port`.
pub fn host_of(entry: &str) -> Result<String, NodeError> {
    let e = entry.trim();
    let e = e.strip_prefix("https://").unwrap_or(e);
    let e = e.split('/').next().unwrap_or(e);
    let host = if let Some(rest) = e.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else if e.matches(':').count() == 1 {
        e.split(':').next().unwrap_or(e)
    } else {
        e
    };
    if host.is_empty() {
        return Err(NodeError::Config(format!("{entry:?} names no host")));
    }
    Ok(host.to_owned())
}

/// The name in node `i`'s certificate (counting from 1, in the order `cluster-certs --nodes`
/// was given the nodes).
pub fn node_name(i: usize) -> String {
    format!("node-{i}.blindfold")
}

/// File in the balancer's directory listing the nodes' names, one per line.
pub const NODE_NAMES: &str = "node-names";

/// Writes the cluster's CA, one certificate per node (in order: `node-1`, `node-2`, …, each
/// for its own name, [`node_name`]) and the balancer's client certificate under `out` (see the
/// module documentation). Returns the directories written, with what each is for.
pub fn write_cluster_certs(
    out: &Path,
    nodes: &[String],
) -> Result<Vec<(PathBuf, String)>, NodeError> {
    if nodes.is_empty() {
        return Err(NodeError::Config("--nodes names no node".into()));
    }
    let hosts: Vec<String> = nodes.iter().map(|n| host_of(n)).collect::<Result<_, _>>()?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls_err("CA"))?;
    ca.distinguished_name.push(DnType::CommonName, "blindfold cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().map_err(tls_err("CA key"))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(tls_err("CA"))?;
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::from_params(&ca, &ca_key);
    let leaf = |sans: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(sans).map_err(tls_err(cn))?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().map_err(tls_err(cn))?;
        let cert = p.signed_by(&key, &issuer).map_err(tls_err(cn))?;
        Ok::<_, NodeError>((cert.pem(), key.serialize_pem()))
    };
    // Everything is made in memory first: a bad host name writes nothing.
    let mut leaves = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let name = node_name(i + 1);
        let (cert, key) = leaf(
            vec![name.clone()],
            &format!("blindfold {name} ({host})"),
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        leaves.push((out.join(format!("node-{}", i + 1)), cert, key, format!("{name} on {host}")));
    }
    let (cert, key) = leaf(Vec::new(), "blindfold balancer", ExtendedKeyUsagePurpose::ClientAuth)?;
    leaves.push((out.join("balancer"), cert, key, "the balancer (serve --nodes)".to_owned()));
    let ca_dir = out.join("ca");
    new_private_dir(&ca_dir)?;
    write_private(&ca_dir.join("cert.pem"), ca_pem.as_bytes())?;
    write_private(&ca_dir.join("key.pem"), ca_key.serialize_pem().as_bytes())?;
    let mut written = vec![(ca_dir, "the cluster CA (move key.pem offline)".to_owned())];
    let names: String = (1..=hosts.len()).map(|i| node_name(i) + "\n").collect();
    for (dir, cert, key, what) in leaves {
        new_private_dir(&dir)?;
        write_private(&dir.join("ca.pem"), ca_pem.as_bytes())?;
        write_private(&dir.join("cert.pem"), cert.as_bytes())?;
        write_private(&dir.join("key.pem"), key.as_bytes())?;
        if dir.ends_with("balancer") {
            write_private(&dir.join(NODE_NAMES), names.as_bytes())?;
        }
        written.push((dir, what));
    }
    Ok(written)
}

/// One party's TLS material: the cluster CA, its certificate and its key (PEM), and for the
/// balancer the names of the cluster's nodes.
#[derive(Clone)]
pub struct ClusterTls {
    ca: String,
    cert: String,
    key: String,
    node_names: Vec<String>,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls").finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// Reads `ca.pem`, `cert.pem` and `key.pem` from `dir` (as `cluster-certs` writes them).
    pub fn load(dir: &Path) -> Result<Self, NodeError> {
        let read = |name: &str| {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                NodeError::Tls(format!(
                    "{}: {e} (--tls-dir names a directory written by `blindfold cluster-certs`)",
                    path.display()
                ))
            })?;
            if !text.contains("-----BEGIN") {
                return Err(NodeError::Tls(format!("{}: not a PEM file", path.display())));
            }
            Ok(text)
        };
        // Only the balancer's directory lists the node names; nodes need none.
        let node_names = match std::fs::read_to_string(dir.join(NODE_NAMES)) {
            Ok(text) => {
                text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(NodeError::Tls(format!("{}: {e}", dir.join(NODE_NAMES).display())))
            }
        };
        Ok(Self { ca: read("ca.pem")?, cert: read("cert.pem")?, key: read("key.pem")?, node_names })
    }

    /// The names of the cluster's nodes (the balancer's side; see the module documentation).
    pub fn node_names(&self) -> Result<&[String], NodeError> {
        if self.node_names.is_empty() {
            return Err(NodeError::Tls(format!(
                "the balancer's --tls-dir has no {NODE_NAMES} file: its certificates come from an \
                 older `blindfold cluster-certs`, whose node certificates name hosts, not nodes \
                 (two nodes on one host could stand in for each other); run `blindfold \
                 cluster-certs` again and give the nodes their new directories"
            )));
        }
        Ok(&self.node_names)
    }

    /// The node side: present this certificate, require a client certificate from the CA.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .client_auth_optional(false)
    }

    /// The balancer side: present this certificate, trust only the CA, expect a certificate
    /// for `name` (a node's name, [`node_name`]).
    pub fn client(&self, name: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_taken_from_node_entries() {
        assert_eq!(host_of("10.0.0.1").unwrap(), "10.0.0.1");
        assert_eq!(host_of("a.example:7500").unwrap(), "a.example");
        assert_eq!(host_of("https://b.example:7500").unwrap(), "b.example");
        assert_eq!(host_of("[::1]:7500").unwrap(), "::1");
        assert_eq!(host_of("::1").unwrap(), "::1");
        assert!(host_of(" ").is_err());
    }

    #[test]
    fn cluster_certs_are_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let written =
            write_cluster_certs(&out, &["127.0.0.1".into(), "node.example".into()]).unwrap();
        assert_eq!(written.len(), 4);
        for d in ["ca", "node-1", "node-2", "balancer"] {
            for entry in std::fs::read_dir(out.join(d)).unwrap() {
                let mode = entry.unwrap().metadata().unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600);
            }
        }
        ClusterTls::load(&out.join("node-2")).unwrap();
        let balancer = ClusterTls::load(&out.join("balancer")).unwrap();
        assert_eq!(balancer.node_names().unwrap(), [node_name(1), node_name(2)]);
        assert!(ClusterTls::load(&out.join("node-1")).unwrap().node_names().is_err());
        assert!(write_cluster_certs(&out, &["127.0.0.1".into()]).is_err());
    }
}
