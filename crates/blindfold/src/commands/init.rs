//! `blindfold init`: create a new key file.

use anyhow::{Context, Result};
use blindfold_crypto::create_key_file;
use clap::Args;

use crate::commands::data_dir::KeyArgs;
use crate::commands::passphrase::read_passphrase;

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub key: KeyArgs,
}

pub fn run(args: InitArgs) -> Result<()> {
    let pass = if args.key.passphrase { Some(read_passphrase()?) } else { None };
    if let Some(dir) = args.key.key_file.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    create_key_file(&args.key.key_file, pass.as_ref())?;
    println!("created key file {}", args.key.key_file.display());
    println!("keep a copy somewhere safe: without this key (and its passphrase, if any) the data cannot be read");
    Ok(())
}
