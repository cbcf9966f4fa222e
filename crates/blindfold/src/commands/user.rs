//! `blindfold user`: manage the S3 users besides the administrator.

use anyhow::{bail, Result};
use clap::Subcommand;

use crate::commands::data_dir::UserDirArgs;
use crate::commands::passphrase::read_passphrase;

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user; prints its access key and secret key (once: they are not shown again).
    Add {
        /// Its name (a-z, 0-9, '.', '_', '-').
        name: String,
        /// Buckets it may use, comma-separated: names, prefixes ending in '*' (`team-*`), or
        /// '*' for all. It may create and delete the buckets these cover (unless --read-only).
        #[arg(long, value_delimiter = ',', required = true)]
        buckets: Vec<String>,
        /// Only reads: GET, HEAD and listings; every write is AccessDenied.
        #[arg(long)]
        read_only: bool,
        /// It may delete, or shorten the retention of, object versions under GOVERNANCE
        /// retention, with the header `x-amz-bypass-governance-retention: true` (object lock).
        /// COMPLIANCE retention and legal holds bind it as everyone.
        #[arg(long)]
        bypass_governance: bool,
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// List the users: names, access keys, buckets, read-only (never secrets).
    List {
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// Remove a user: its keys stop working within a second. Its buckets and objects stay.
    Remove {
        /// The user's name.
        name: String,
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// Give a user a new secret key (the access key stays); prints it once. The old secret
    /// stops working within a second.
    Rotate {
        /// The user's name.
        name: String,
        #[command(flatten)]
        dir: UserDirArgs,
    },
}

pub fn run(cmd: UserCommand) -> Result<()> {
    match cmd {
        UserCommand::Add { name, buckets, read_only, bypass_governance, dir } => {
            let u = user_file(&dir)?.add_with(&name, buckets, read_only, bypass_governance)?;
            println!("added user {}", u.name);
            println!("  access key: {}", u.access_key);
            println!("  secret key: {} (shown once)", u.secret_key());
            println!(
                "  buckets: {}{}{}",
                u.buckets.join(","),
                if u.read_only { " (read only)" } else { "" },
                if u.bypass_governance { " (may bypass governance retention)" } else { "" }
            );
        }
        UserCommand::List { dir } => {
            let users = user_file(&dir)?.read()?;
            if users.is_empty() {
                println!("no users besides the administrator (credentials.json)");
            }
            for u in users {
                println!(
                    "{:<20} {:<22} {}{}",
                    u.name,
                    u.access_key,
                    u.buckets.join(","),
                    if u.read_only { " (read only)" } else { "" }
                );
            }
        }
        UserCommand::Remove { name, dir } => {
            let u = user_file(&dir)?.remove(&name)?;
            println!("removed user {} (access key {})", u.name, u.access_key);
        }
        UserCommand::Rotate { name, dir } => {
            let u = user_file(&dir)?.rotate(&name)?;
            println!("new secret key for {} (access key {})", u.name, u.access_key);
            println!("  secret key: {} (shown once)", u.secret_key());
        }
    }
    Ok(())
}

fn user_file(a: &UserDirArgs) -> Result<blindfold_gateway::users::UserFile> {
    if !a.data_dir.join("gateway.json").exists() {
        bail!(
            "{} holds no gateway (no gateway.json): give --data-dir of a gateway that has \
             started at least once",
            a.data_dir.display()
        );
    }
    let key_file = a.key_file.clone().unwrap_or_else(|| a.data_dir.join("key.json"));
    let pass = if a.passphrase { Some(read_passphrase()?) } else { None };
    let keys = blindfold_gateway::server::data_dir_keys(&a.data_dir, &key_file, pass.as_ref())?;
    use blindfold_gateway::users::UserFile;
    Ok(match (&keys.rotation, &keys.previous) {
        // A rotation no gateway has begun yet: one still running reads users under the old
        // key, so they stay under it (the gateway that begins the rotation re-seals them).
        (Some(r), Some(old)) if r.paths == 0 => {
            UserFile::new(&a.data_dir, old).with_previous(Some(&keys.current))
        }
        (_, previous) => UserFile::new(&a.data_dir, &keys.current).with_previous(previous.as_ref()),
    })
}
