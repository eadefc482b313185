//! Files isthmus writes (gres.conf, node definitions...) are replaced atomically and only when their content
//! changed: temp file in the same directory, fsync, rename over the old one, fsync the directory. On any error the
//! old file is left untouched and the temp file removed.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The file already had this content: nothing was written.
    Unchanged,
    /// The file was created or replaced.
    Written,
}

/// A write failure, with the path it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct WriteError {
    /// The file (or its temp file / directory).
    pub(crate) path: PathBuf,
    /// The cause.
    #[source]
    pub(crate) source: io::Error,
}

fn err(path: &Path, source: io::Error) -> WriteError {
    WriteError {
        path: path.to_path_buf(),
        source,
    }
}

/// Replace `path` with `content` atomically, unless it already holds exactly that content.
pub fn write_if_changed(path: &Path, content: &[u8]) -> Result<WriteOutcome, WriteError> {
    match fs::read(path) {
        Ok(old) if old == content => return Ok(WriteOutcome::Unchanged),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(path, e)),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        err(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.isthmus-{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let create = || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
        };
        let mut f = match create() {
            // Left by an earlier life of this process id: in a pod the agent is always PID 1 and the directory
            // (an emptyDir) outlives a container killed mid-write. No live process but this one has this pid.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp).map_err(|e| err(&tmp, e))?;
                create()
            }
            other => other,
        }
        .map_err(|e| err(&tmp, e))?;
        // Keep the old file's permissions when replacing; new files get 0644.
        let mode = fs::metadata(path).map(|m| m.permissions()).ok();
        f.write_all(content).map_err(|e| err(&tmp, e))?;
        if let Some(mode) = mode {
            fs::set_permissions(&tmp, mode).map_err(|e| err(&tmp, e))?;
        }
        f.sync_all().map_err(|e| err(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| err(path, e))?;
        fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| err(&dir, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| WriteOutcome::Written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_once_and_keeps_old_file_on_error() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("gres.conf");
        assert_eq!(write_if_changed(&p, b"a\n")?, WriteOutcome::Written);
        let before = fs::metadata(&p)?.modified()?;
        assert_eq!(write_if_changed(&p, b"a\n")?, WriteOutcome::Unchanged);
        assert_eq!(fs::metadata(&p)?.modified()?, before);
        assert_eq!(write_if_changed(&p, b"b\n")?, WriteOutcome::Written);
        assert_eq!(fs::read(&p)?, b"b\n");

        // A directory where the file should go: the rename fails, nothing is left behind.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked)?;
        fs::write(blocked.join("x"), b"keep")?;
        assert!(write_if_changed(&blocked, b"new").is_err());
        assert_eq!(fs::read(blocked.join("x"))?, b"keep");
        let leftovers: Vec<_> = fs::read_dir(dir.path())?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());

        // A temp file left by an earlier process with this pid (PID 1 in a pod whose directory survived a kill
        // mid-write) does not block the write, and does not stay.
        let stale = dir
            .path()
            .join(format!(".gres.conf.isthmus-{}.tmp", std::process::id()));
        fs::write(&stale, b"half a file")?;
        assert_eq!(write_if_changed(&p, b"c\n")?, WriteOutcome::Written);
        assert_eq!(fs::read(&p)?, b"c\n");
        assert!(!stale.exists());

        // Unwritable directory: error with the path, old file intact.
        let missing = dir.path().join("no/such/dir/gres.conf");
        let e = write_if_changed(&missing, b"x").err().map(|e| e.path);
        assert!(e.is_some());
        Ok(())
    }
}
