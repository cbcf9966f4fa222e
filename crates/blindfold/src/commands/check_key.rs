//! `blindfold check-key`: check that a key file loads and is private.

use anyhow::Result;
use blindfold_crypto::{key_file_permissions_ok, load_key_file};

use crate::commands::data_dir::KeyArgs;
use crate::commands::passphrase::read_passphrase;

pub fn run(args: KeyArgs) -> Result<()> {
    let pass = if args.passphrase { Some(read_passphrase()?) } else { None };
    load_key_file(&args.key_file, pass.as_ref())?;
    if !key_file_permissions_ok(&args.key_file)? {
        eprintln!(
            "warning: {} is readable by other users; run `chmod 600` on it",
            args.key_file.display()
        );
    }
    println!("key file {} is valid", args.key_file.display());
    Ok(())
}
