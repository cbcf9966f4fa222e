//! `blindfold cluster-certs`: the certificates of a node cluster.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct ClusterCertsArgs {
    /// Directory to create (refuses to overwrite certificates).
    #[arg(long)]
    pub out: PathBuf,
    /// The nodes' hosts (names or IP addresses, `host:port` accepted), comma-separated, in the
    /// order of the `node-1`, `node-2`, … directories. Each node's certificate is for a name of
    /// its own (`node-<i>.blindfold`), so several nodes may share a host.
    #[arg(long, value_delimiter = ',', required = true)]
    pub nodes: Vec<String>,
}

pub fn run(a: ClusterCertsArgs) -> Result<()> {
    let written = blindfold_node::write_cluster_certs(&a.out, &a.nodes)?;
    for (dir, what) in written {
        println!("{}: {what}", dir.display());
    }
    Ok(())
}
