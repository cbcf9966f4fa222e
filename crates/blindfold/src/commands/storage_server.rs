//! `blindfold storage-server`: the untrusted server of sealed cell arrays (and, as
//! `blindfold enclave`, of the TEE engine's trusted component).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::parse::parse_block_size;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct StorageServerArgs {
    /// Address to listen on (`host:port`; port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7420")]
    pub listen: String,
    /// Where the arrays live: `memory:` or `file:///path/to/dir`.
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// The pre-shared key clients must prove they hold: a file of 64 hex digits, mode 0600.
    /// Gateways name the same file in `remote://host:port?key_file=PATH`.
    #[arg(long, required_unless_present = "insecure_no_auth")]
    pub auth_key_file: Option<PathBuf>,
    /// Create `--auth-key-file` with a fresh random key if it does not exist.
    #[arg(long, requires = "auth_key_file")]
    pub generate_auth_key: bool,
    /// Serve anyone who can reach the address, without a key: for experiments on loopback only.
    #[arg(long, conflicts_with = "auth_key_file")]
    pub insecure_no_auth: bool,
    /// Largest request or answer frame, in MiB; clients split batches to fit.
    #[arg(long, default_value_t = 64)]
    pub max_frame_mib: usize,
    /// Largest array (cells × cell size), in GiB.
    #[arg(long, default_value_t = 1024)]
    pub max_array_gib: u64,
    /// Most memory all arrays of a `memory:` store may take together, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_memory_mib: u64,
    /// Most arrays the server holds.
    #[arg(long, default_value_t = 1024)]
    pub max_arrays: usize,
    /// Most connections at once.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Most bytes one connection may hold in requests and answers at once, in MiB (at least
    /// twice --max-frame-mib).
    #[arg(long, default_value_t = 256)]
    pub connection_buffer_mib: usize,
    /// Also run the TEE engine's trusted component with this key (64 hex digits, mode 0600;
    /// `blindfold enclave-key` writes it for a data directory): the server then answers the
    /// TEE queries and eviction rounds of `--engine tee` gateways. Without it they are refused.
    #[arg(long)]
    pub enclave_key: Option<PathBuf>,
    /// Bytes per block of the TEE engine the trusted component serves (the gateway's
    /// --block-size).
    #[arg(long, value_parser = parse_block_size, default_value = "1KiB")]
    pub enclave_block_size: u32,
}

pub fn run(args: StorageServerArgs) -> Result<()> {
    runtime::on_all_cores(storage_server(args))
}

async fn storage_server(args: StorageServerArgs) -> Result<()> {
    if matches!(args.store, StoreUrl::Remote { .. }) {
        bail!("a storage server keeps its arrays in `memory:` or `file:///dir`, not in another server");
    }
    use blindfold_server::{Auth, Limits, ServerConfig};
    use blindfold_store::remote::AuthKey;
    let auth = match &args.auth_key_file {
        Some(path) if args.generate_auth_key && !path.exists() => {
            let key = AuthKey::create(path)?;
            say_err!(
                "generated a new storage auth key in {}; give gateways a copy (mode 0600) and \
                 name it in remote://HOST:PORT?key_file=PATH",
                path.display()
            );
            Auth::Key(key)
        }
        Some(path) => Auth::Key(AuthKey::load(path).with_context(|| {
            format!("(create one with --generate-auth-key) loading {}", path.display())
        })?),
        None => {
            say_err!(
                "WARNING: --insecure-no-auth: anyone who can reach {} can read, overwrite and \
                 fill the arrays",
                args.listen
            );
            Auth::InsecureNone
        }
    };
    const MIB: usize = 1 << 20;
    let limits = Limits {
        max_frame: args.max_frame_mib.saturating_mul(MIB),
        max_array_bytes: args.max_array_gib.saturating_mul(1 << 30),
        max_memory_bytes: args.max_memory_mib.saturating_mul(1 << 20),
        max_arrays: args.max_arrays,
        max_connections: args.max_connections,
        connection_buffer: args.connection_buffer_mib.saturating_mul(MIB),
        ..Limits::default()
    };
    let trusted: Option<Arc<dyn blindfold_store::Trusted>> = match &args.enclave_key {
        Some(path) => {
            let key = blindfold_tee::TeeKey::load(path)
                .with_context(|| format!("loading the enclave key {}", path.display()))?;
            say_err!(
                "trusted component enabled (blocks of {} bytes); without SGX this host holds \
                 the key and can read the TEE engine's blocks",
                args.enclave_block_size
            );
            Some(Arc::new(blindfold_tee::Enclave::new(&key, args.enclave_block_size as usize)))
        }
        None => None,
    };
    let config = ServerConfig { auth, limits, trusted };
    let server = blindfold_server::Server::bind(&args.listen, args.store.clone(), config)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    // One line on standard output, so scripts (and tests) can learn a port picked with :0.
    say_out!(
        "blindfold storage-server listening on {} (store {})",
        server.local_addr(),
        args.store
    );
    tokio::select! {
        r = server.run() => r.context("serving")?,
        _ = tokio::signal::ctrl_c() => say_err!("interrupted; stopping"),
    }
    Ok(())
}
