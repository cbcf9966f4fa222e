//! Reading a key file's passphrase from the environment or standard input.

use std::io::BufRead;

use anyhow::{bail, Context, Result};
use blindfold_crypto::Passphrase;

/// The passphrase of `--passphrase`: $BLINDFOLD_PASSPHRASE, or else one line of standard
/// input.
pub fn read_passphrase() -> Result<Passphrase> {
    if let Ok(p) = std::env::var("BLINDFOLD_PASSPHRASE") {
        return Ok(Passphrase::new(p));
    }
    eprintln!("passphrase (one line on standard input):");
    read_line_passphrase()
}

/// One line of standard input, not empty.
pub fn read_line_passphrase() -> Result<Passphrase> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the passphrase")?;
    let line = line.trim_end_matches(['\r', '\n']).to_string();
    if line.is_empty() {
        bail!("empty passphrase");
    }
    Ok(Passphrase::new(line))
}
