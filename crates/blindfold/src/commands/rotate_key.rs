//! `blindfold rotate-key`: prepare the rotation of a data directory's master key.

use anyhow::{bail, Result};
use blindfold_crypto::Passphrase;
use clap::Args;

use crate::commands::data_dir::{gateway_running, UserDirArgs};
use crate::commands::passphrase::{read_line_passphrase, read_passphrase};

#[derive(Args, Debug)]
pub struct RotateKeyArgs {
    #[command(flatten)]
    pub dir: UserDirArgs,
    /// Protect the new key file with a passphrase: read it from $BLINDFOLD_NEW_PASSPHRASE, or
    /// else one line of standard input (after the current one, if --passphrase).
    #[arg(long)]
    pub new_passphrase: bool,
}

pub fn run(a: RotateKeyArgs) -> Result<()> {
    let dir = &a.dir.data_dir;
    if !dir.join("gateway.json").exists() {
        bail!(
            "{} holds no gateway (no gateway.json): give --data-dir of a gateway that has \
             started at least once",
            dir.display()
        );
    }
    let params = blindfold_gateway::server::read_params(dir)?;
    let key_file = a.dir.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = if a.dir.passphrase { Some(read_passphrase()?) } else { None };
    let keys = blindfold_gateway::server::data_dir_keys(dir, &key_file, pass.as_ref())?;
    if let Some(r) = &keys.rotation {
        bail!(
            "a key rotation is already under way in {} ({}): start `blindfold serve` there to \
             let it finish",
            dir.display(),
            r.progress()
        );
    }
    let new_pass = if a.new_passphrase {
        Some(match std::env::var("BLINDFOLD_NEW_PASSPHRASE") {
            Ok(p) if !p.is_empty() => Passphrase::new(p),
            Ok(_) => bail!("$BLINDFOLD_NEW_PASSPHRASE is empty"),
            Err(_) => {
                eprintln!("new passphrase:");
                read_line_passphrase()?
            }
        })
    } else {
        None
    };
    let next =
        blindfold_gateway::rotation::prepare(dir, &key_file, &keys.current, new_pass.as_ref())?;
    let running = gateway_running(dir);
    println!("prepared a key rotation for {}", dir.display());
    println!("  new key file: {} (keep it as safe as the current one)", next.display());
    println!(
        "  {} `blindfold serve` on this data directory to begin: it re-seals every cell while \
         it serves, then replaces {} with the new key file",
        if running { "a gateway is running there; restart" } else { "start" },
        key_file.display()
    );
    println!("  until it ends, keep both key files: the gateway needs the current one to start");
    if let Some(p) = params.filter(|p| p.trusted_component_elsewhere()) {
        let pass = if new_pass.is_some() { " --passphrase" } else { "" };
        println!(
            "  the tee engine's trusted component runs in `blindfold enclave` ({}), which holds \
             the current key's TEE key. Before the gateway starts under the new key: stop the \
             gateway, write the new TEE key with\n      blindfold enclave-key --key-file {}{pass} \
             --out NEW-TEE-KEY\n  and restart `blindfold enclave` at the same address with \
             --enclave-key NEW-TEE-KEY; then start the gateway: it re-keys every cell itself \
             (it holds both keys). Until then the gateway cannot serve; afterwards the old TEE \
             key file opens nothing and may be destroyed",
            p.store,
            next.display()
        );
    }
    Ok(())
}
