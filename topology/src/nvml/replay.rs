//! NVML answers replayed from a recording: `nvidia-smi -q` or `nvidia-smi -q -x`, optionally followed by the
//! `nvidia-smi mig -lgip` table of the same GPU model, plus an optional `nvidia-smi nvlink -s`.

use super::query_text::{parse_nvidia_smi_query, parse_nvlink_status};
use super::query_xml::parse_nvidia_smi_xml;
use super::{NvmlSnapshot, NvmlSource, NvmlUnavailable};
use crate::mig::{GpuInstanceProfile, parse_lgip, resolve_slices};

/// NVML answers replayed from recorded `nvidia-smi` output.
#[derive(Debug, Clone)]
pub struct RecordedNvml {
    name: String,
    snapshot: NvmlSnapshot,
}

/// Split a recording into the `nvidia-smi -q`/`-q -x` document and the lines of an `nvidia-smi mig -lgip` table
/// appended to it (table lines start with `|` or `+`).
fn split_bundle(text: &str) -> (String, String) {
    if let Some(start) = text.find("<?xml").or_else(|| text.find("<nvidia_smi_log")) {
        const END: &str = "</nvidia_smi_log>";
        let end = text[start..]
            .find(END)
            .map_or(text.len(), |e| start + e + END.len());
        let rest = format!("{}\n{}", &text[..start], &text[end..]);
        return (text[start..end].to_owned(), rest);
    }
    let (mut query, mut table) = (String::new(), String::new());
    for line in text.lines() {
        let t = line.trim_start();
        let target = if t.starts_with('|') || t.starts_with('+') {
            &mut table
        } else {
            &mut query
        };
        target.push_str(line);
        target.push('\n');
    }
    (query, table)
}

impl RecordedNvml {
    /// Parse a recording: `query` holds `nvidia-smi -q` or `nvidia-smi -q -x` output, optionally followed by the
    /// `nvidia-smi mig -lgip` table recorded on the same kind of GPU (it names MIG devices' profiles, which the
    /// query dump does not); `nvlink_status` is the output of `nvidia-smi nvlink -s` when one was recorded.
    pub fn parse(name: impl Into<String>, query: &str, nvlink_status: Option<&str>) -> Self {
        let (doc, table) = split_bundle(query);
        let mut snapshot = if doc.contains("<nvidia_smi_log") {
            parse_nvidia_smi_xml(&doc)
        } else {
            parse_nvidia_smi_query(&doc)
        };
        if let Some(text) = nvlink_status {
            let links = parse_nvlink_status(text);
            for gpu in &mut snapshot.gpus {
                if let Some(l) = links.get(&gpu.index) {
                    gpu.nvlinks = l.clone();
                }
            }
        }
        let mut me = Self {
            name: name.into(),
            snapshot,
        };
        me.apply_mig_profiles(&parse_lgip(&table));
        me
    }

    fn apply_mig_profiles(&mut self, table: &[GpuInstanceProfile]) {
        for gpu in &mut self.snapshot.gpus {
            for dev in &mut gpu.mig_devices {
                resolve_slices(dev, table);
            }
        }
    }
}

impl NvmlSource for RecordedNvml {
    fn describe(&self) -> String {
        format!("recording {}", self.name)
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        Ok(self.snapshot.clone())
    }
}

/// A recording on disk that is read again whenever it changes (another file, size or modification time), so that a
/// replayed host can change its NVML answers while the agent runs (a row remap that becomes pending, then a reset).
/// A recording that cannot be read keeps the previous answers; the failure is one of the snapshot's problems.
#[derive(Debug)]
pub struct RecordingFile {
    path: std::path::PathBuf,
    nvlink_status: Option<String>,
    last: std::sync::Mutex<(Option<FileStamp>, RecordedNvml)>,
}

/// What tells one version of a file from another.
type FileStamp = (u64, u64, Option<std::time::SystemTime>);

fn stamp(path: &std::path::Path) -> std::io::Result<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.ino(), m.len(), m.modified().ok()))
}

impl RecordingFile {
    /// Read `path` now (an error if it cannot be read), and again whenever it changes.
    pub fn open(
        path: impl Into<std::path::PathBuf>,
        nvlink_status: Option<String>,
    ) -> std::io::Result<Self> {
        let path = path.into();
        let at = stamp(&path)?;
        let text = std::fs::read_to_string(&path)?;
        let rec = RecordedNvml::parse(path.display().to_string(), &text, nvlink_status.as_deref());
        Ok(Self {
            path,
            nvlink_status,
            last: std::sync::Mutex::new((Some(at), rec)),
        })
    }
}

impl NvmlSource for RecordingFile {
    fn describe(&self) -> String {
        format!("recording {}", self.path.display())
    }

    fn snapshot(&self) -> Result<NvmlSnapshot, NvmlUnavailable> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| NvmlUnavailable("the recording's lock is poisoned".to_owned()))?;
        let problem = match stamp(&self.path) {
            Ok(now) if Some(now) == last.0 => None,
            Ok(now) => match std::fs::read_to_string(&self.path) {
                Ok(text) => {
                    let rec = RecordedNvml::parse(
                        self.path.display().to_string(),
                        &text,
                        self.nvlink_status.as_deref(),
                    );
                    *last = (Some(now), rec);
                    None
                }
                Err(e) => Some(e),
            },
            Err(e) => Some(e),
        };
        let mut snap = last.1.snapshot.clone();
        if let Some(e) = problem {
            snap.problems.push(format!(
                "the recording {} cannot be read ({e}); its previous answers stand",
                self.path.display()
            ));
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bundles_split_into_dump_and_table() {
        let (doc, table) =
            split_bundle("<?xml version=\"1.0\"?>\n<nvidia_smi_log></nvidia_smi_log>\n| row |\n");
        assert!(doc.ends_with("</nvidia_smi_log>"));
        assert!(table.contains("| row |"));
        let (doc, table) = split_bundle(
            "GPU 00000000:01:00.0\n    Minor Number : 0\n+---+\n|   0  MIG 1g.10gb |\n",
        );
        assert!(doc.contains("Minor Number"));
        assert!(table.contains("MIG 1g.10gb") && !doc.contains("MIG"));
    }

    #[test]
    fn a_recording_file_is_read_again_when_it_changes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.txt");
        let one = "GPU 00000000:07:00.0\n    Minor Number : 0\n";
        std::fs::write(&path, one)?;
        let src = RecordingFile::open(&path, None)?;
        assert_eq!(src.snapshot()?.gpus.len(), 1);
        let two = format!("{one}GPU 00000000:08:00.0\n    Minor Number : 1\n");
        std::fs::write(dir.path().join("new"), two)?;
        std::fs::rename(dir.path().join("new"), &path)?;
        assert_eq!(src.snapshot()?.gpus.len(), 2);
        std::fs::remove_file(&path)?;
        let s = src.snapshot()?;
        assert_eq!(s.gpus.len(), 2, "the previous answers stand");
        assert!(
            s.problems.iter().any(|p| p.contains("cannot be read")),
            "{:?}",
            s.problems
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".*", n in proptest::option::of(".*")) {
            let _ = RecordedNvml::parse("x", &s, n.as_deref()).snapshot();
        }
    }
}
