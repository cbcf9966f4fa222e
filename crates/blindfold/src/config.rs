//! `blindfold serve --config FILE`: settings from a TOML file.
//!
//! Every long flag of `serve` (and the global `--log`, `--log-format`) is a key, spelled as
//! the flag without its dashes: `data-dir = "/srv/blindfold"`, `cache-mib = 64`,
//! `in-place = true`. Flags on the command line and environment variables win over the file;
//! the file wins over the defaults. The file is turned into flags placed right after `serve`,
//! so clap checks its values exactly as it checks typed ones, with the same messages.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::ArgAction;

/// Keys that may not appear in a configuration file.
const NOT_IN_FILE: &[&str] = &["config", "help", "version"];

/// `args` with the settings of `serve --config FILE` added as flags (unchanged if there is
/// no such file to read), for the command line `cmd` (the whole `blindfold` command). Errors
/// name the file and the key.
pub fn apply_config_file(cmd: clap::Command, args: Vec<OsString>) -> Result<Vec<OsString>> {
    // Anything clap would refuse is left for the real parse to report.
    let Ok(matches) = cmd.clone().try_get_matches_from(&args) else { return Ok(args) };
    let Some(("serve", sub)) = matches.subcommand() else { return Ok(args) };
    let Some(path) = sub.get_one::<std::path::PathBuf>("config").cloned() else {
        return Ok(args);
    };
    let serve = cmd.find_subcommand("serve").context("the serve command")?;
    // Asking the top-level matches about an argument it does not have panics (in debug
    // builds): only the global ones are asked there.
    let top_ids: Vec<String> = cmd.get_arguments().map(|a| a.get_id().to_string()).collect();
    let flags = flags_from_file(
        &path,
        |id| {
            let top =
                || top_ids.iter().any(|t| t == id).then(|| matches.value_source(id)).flatten();
            let source = sub.value_source(id).or_else(top);
            matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable))
        },
        serve,
        &cmd,
    )?;
    // Right after `serve`: globals and `serve`'s own flags are both accepted there.
    let at = args.iter().position(|a| a == "serve").map_or(args.len(), |i| i + 1);
    let mut out = args;
    out.splice(at..at, flags);
    Ok(out)
}

/// The flags the file at `path` stands for, leaving out those `given` says were given
/// already.
fn flags_from_file(
    path: &Path,
    given: impl Fn(&str) -> bool,
    serve: &clap::Command,
    top: &clap::Command,
) -> Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    let table: toml::Table =
        text.parse().with_context(|| format!("{} is not valid TOML", path.display()))?;
    warn_if_readable(path, &table);
    let args: Vec<&clap::Arg> =
        serve.get_arguments().chain(top.get_arguments().filter(|a| a.is_global_set())).collect();
    let known = || -> String {
        let mut keys: Vec<String> = args
            .iter()
            .filter_map(|a| a.get_long())
            .filter(|l| !NOT_IN_FILE.contains(l))
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys.join(", ")
    };
    let mut flags = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = args.iter().find(|a| a.get_long() == Some(long.as_str())) else {
            bail!(
                "{}: unknown key {key:?}; the keys are the long flags of `blindfold serve` \
                 without their dashes: {}",
                path.display(),
                known()
            );
        };
        if NOT_IN_FILE.contains(&long.as_str()) {
            bail!("{}: {key:?} cannot be set in a configuration file", path.display());
        }
        if given(arg.get_id().as_str()) {
            continue; // the command line or the environment says otherwise: they win
        }
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let text = match value {
            toml::Value::Boolean(b) if switch => {
                if *b {
                    flags.push(OsString::from(format!("--{long}")));
                }
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => {
                let mut parts = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) => parts.push(s.clone()),
                        toml::Value::Integer(i) => parts.push(i.to_string()),
                        toml::Value::Float(f) => parts.push(f.to_string()),
                        _ => bail!(
                            "{}: {key:?} lists something other than text or numbers",
                            path.display()
                        ),
                    }
                }
                parts.join(",")
            }
            other => bail!(
                "{}: {key:?} = {other} is not a value a flag takes (text, a number, true/false)",
                path.display()
            ),
        };
        if switch {
            bail!("{}: {key:?} is a switch: write {key} = true or false", path.display());
        }
        flags.push(OsString::from(format!("--{long}={text}")));
    }
    Ok(flags)
}

/// Secrets in a file others can read are worth a warning (the file is not changed).
fn warn_if_readable(path: &Path, table: &toml::Table) {
    use std::os::unix::fs::PermissionsExt;
    let secret = ["secret-key", "secret_key", "admin-token", "admin_token"]
        .iter()
        .any(|k| table.contains_key(*k));
    let mode = std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0);
    if secret && mode & 0o077 != 0 {
        eprintln!(
            "blindfold: warning: {} holds a secret and other users can read it; run `chmod 600` \
             on it",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn serve_args(args: &[&str]) -> crate::commands::serve::ServeArgs {
        let args =
            apply_config_file(crate::Cli::command(), args.iter().map(OsString::from).collect())
                .unwrap();
        match crate::Cli::parse_from(args).command {
            crate::Command::Serve(a) => a,
            other => panic!("not serve: {other:?}"),
        }
    }

    fn write(dir: &Path, text: &str) -> String {
        let p = dir.join("blindfold.toml");
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    }

    #[test]
    fn the_file_sets_what_the_flags_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "data-dir = \"/srv/bf\"\ncache_mib = 64\nin-place = true\nlisten = 9200\n\
             admin-listen = \"127.0.0.1:9101\"\nengine = \"path-oram\"\n",
        );
        let a = serve_args(&["blindfold", "serve", "--config", &f]);
        assert_eq!(a.gateway.data_dir, Path::new("/srv/bf"));
        assert_eq!(a.cache_mib, Some(64));
        assert!(a.in_place);
        assert_eq!(a.listen.port(), 9200);
        assert_eq!(a.admin_listen.map(|s| s.port()), Some(9101));
        // A flag on the command line wins over the file.
        let a = serve_args(&["blindfold", "serve", "--config", &f, "--cache-mib", "8"]);
        assert_eq!(a.cache_mib, Some(8));
        assert_eq!(a.gateway.data_dir, Path::new("/srv/bf"));
    }

    #[test]
    fn bad_files_are_refused_with_the_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let run = |text: &str| {
            let f = write(dir.path(), text);
            let args = ["blindfold", "serve", "--config", &f].map(OsString::from).to_vec();
            apply_config_file(crate::Cli::command(), args).map(|_| ()).unwrap_err().to_string()
        };
        let e = run("cache-mb = 3\n");
        assert!(e.contains("unknown key \"cache-mb\"") && e.contains("cache-mib"), "{e}");
        let e = run("in-place = \"yes\"\n");
        assert!(e.contains("switch"), "{e}");
        let e = run("config = \"other.toml\"\n");
        assert!(e.contains("cannot be set"), "{e}");
        let e = run("listen = [\n");
        assert!(e.contains("not valid TOML"), "{e}");
        let e = run("store = { a = 1 }\n");
        assert!(e.contains("not a value"), "{e}");
    }

    #[test]
    fn the_example_file_lists_every_serve_flag_and_parses() {
        let example = include_str!("../../../docs/blindfold.example.toml");
        let keys: Vec<String> = example
            .lines()
            .filter_map(|l| {
                let l = l.trim_start_matches('#').trim();
                let (k, _) = l.split_once('=')?;
                let k = k.trim();
                (!k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                    .then(|| k.to_owned())
            })
            .collect();
        let cmd = crate::Cli::command();
        let serve = cmd.find_subcommand("serve").unwrap();
        let globals = cmd.get_arguments().filter(|a| a.is_global_set());
        for arg in serve.get_arguments().chain(globals) {
            let Some(long) = arg.get_long() else { continue };
            if NOT_IN_FILE.contains(&long) {
                continue;
            }
            assert!(keys.iter().any(|k| k == long), "docs/blindfold.example.toml lacks {long:?}");
        }
        // Its uncommented settings are accepted as they are.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("example.toml");
        std::fs::write(&f, example).unwrap();
        let _ = serve_args(&["blindfold", "serve", "--config", f.to_str().unwrap()]);
    }
}
