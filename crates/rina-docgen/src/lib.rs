//! Man pages and shell completions of the RINA binaries, generated from
//! their clap definitions.
//!
//! Every binary calls [`handle::<Cli>()`](handle) first thing in `main`: run
//! as `<tool> --generate-docs DIR` (a hidden option, not in `--help`), it
//! writes its pages and completions under `DIR` and exits; otherwise it
//! returns and the tool parses its command line as usual.
//! `scripts/gen-docs.sh` runs every binary that way.
//!
//! Layout under `DIR`: `man/man1/<tool>.1` and one `<tool>-<sub>.1` per
//! subcommand; `completions/<tool>.bash`, `completions/_<tool>` (zsh),
//! `completions/<tool>.fish`.

use clap::CommandFactory;
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The hidden option that asks for the files.
pub const FLAG: &str = "--generate-docs";

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DocgenError {
    /// A folder or file under the output folder could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The folder or file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DocgenError + '_ {
    move |source| DocgenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the man pages (the command's and its subcommands') and the bash,
/// zsh and fish completions of `cmd` under `dir`; returns the files written.
pub fn generate(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, DocgenError> {
    let man = dir.join("man").join("man1");
    let comp = dir.join("completions");
    for d in [&man, &comp] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let name = cmd.get_name().to_string();
    // One page per command and visible subcommand: `<tool>.1`, `<tool>-<sub>.1`.
    clap_mangen::generate_to(cmd.clone(), &man).map_err(io(&man))?;
    let mut written: Vec<PathBuf> = std::fs::read_dir(&man)
        .map_err(io(&man))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.ends_with(".1")
                    && (n == format!("{name}.1") || n.starts_with(&format!("{name}-")))
            })
        })
        .collect();
    written.sort();
    let mut cmd = cmd;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, &name, &comp).map_err(io(&comp))?;
        written.push(path);
    }
    Ok(written)
}

/// If the command line is `<tool> --generate-docs DIR`, writes the files
/// of `C` under `DIR`, prints their paths and exits (status 0, or 1 if
/// they could not be written); otherwise returns at once.
pub fn handle<C: CommandFactory>() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(FLAG)) {
        return;
    }
    let Some(dir) = args.next() else {
        eprintln!("{FLAG} needs a folder");
        std::process::exit(2);
    };
    match generate(C::command(), Path::new(&dir)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{FLAG}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A test tool.
    #[derive(Parser)]
    #[command(name = "demo-tool", version)]
    struct Cli {
        #[command(subcommand)]
        mode: Mode,
    }

    #[derive(clap::Subcommand)]
    enum Mode {
        /// Serve things.
        Server {
            /// Name to register.
            #[arg(long)]
            name: String,
        },
        /// Ask for things.
        Client,
    }

    #[test]
    fn pages_and_completions_name_the_options_and_subcommands() {
        let dir = std::env::temp_dir().join(format!("rina-docgen-{}", std::process::id()));
        let files = generate(Cli::command(), &dir).expect("generated");
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "demo-tool.1",
            "demo-tool-server.1",
            "demo-tool-client.1",
            "demo-tool.bash",
            "_demo-tool",
            "demo-tool.fish",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        let page = std::fs::read_to_string(dir.join("man/man1/demo-tool-server.1")).unwrap();
        assert!(
            page.contains("Serve things") && page.contains("name"),
            "{page}"
        );
        let bash = std::fs::read_to_string(dir.join("completions/demo-tool.bash")).unwrap();
        assert!(bash.contains("server") && bash.contains("client"));
        // An output path that is a file is an error, not a panic.
        let blocked = dir.join("blocked");
        std::fs::write(&blocked, b"x").unwrap();
        assert!(matches!(
            generate(Cli::command(), &blocked),
            Err(DocgenError::Io { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
