//! `blindfold enclave-key`: write the key a TEE engine shares with its trusted component.

use std::path::PathBuf;

use anyhow::{Context, Result};
use blindfold_crypto::load_key_file;
use clap::Args;

use crate::commands::data_dir::KeyArgs;
use crate::commands::passphrase::read_passphrase;

#[derive(Args, Debug)]
pub struct EnclaveKeyArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    /// Where to write the TEE key (refuses to overwrite).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: EnclaveKeyArgs) -> Result<()> {
    let pass = if args.key.passphrase { Some(read_passphrase()?) } else { None };
    let master = load_key_file(&args.key.key_file, pass.as_ref())
        .with_context(|| format!("loading {}", args.key.key_file.display()))?;
    blindfold_proxy::DurableTee::tee_key(&master)
        .write_new(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "wrote the TEE key of {} to {}: start the trusted component with `blindfold enclave \
         --enclave-key {}` (whoever holds this file can read the TEE engine's blocks)",
        args.key.key_file.display(),
        args.out.display(),
        args.out.display()
    );
    Ok(())
}
