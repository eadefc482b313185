//! A kernel-log recording of XID events, read as it grows (`--xid-replay`): each read returns the events of the
//! complete lines appended since the last one. A file that shrank was replaced: it is read again from the start.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use isthmus_topology::health::kmsg::{XidEvent, parse_xid_line};

/// Most bytes taken in one read (the rest waits for the next).
const MAX_READ: u64 = 1 << 20;

/// Longest partial line kept between reads; a longer one is dropped.
const MAX_PARTIAL: usize = 4096;

/// The reader.
#[derive(Debug)]
pub(super) struct XidTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    warned: bool,
}

impl XidTail {
    /// Read `path` from its start.
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: Vec::new(),
            warned: false,
        }
    }

    /// The events of the lines appended since the last read. A file that cannot be read is a warning (once) and
    /// no events.
    pub(super) fn read(&mut self) -> Vec<XidEvent> {
        match self.read_bytes() {
            Ok(bytes) => {
                self.warned = false;
                self.events(&bytes)
            }
            Err(e) => {
                if !self.warned {
                    tracing::warn!(file = %self.path.display(), error = %e, "the XID recording cannot be read");
                    self.warned = true;
                }
                Vec::new()
            }
        }
    }

    fn read_bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(&self.path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(MAX_READ).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        Ok(buf)
    }

    fn events(&mut self, bytes: &[u8]) -> Vec<XidEvent> {
        self.partial.extend_from_slice(bytes);
        let Some(last_nl) = self.partial.iter().rposition(|b| *b == b'\n') else {
            if self.partial.len() > MAX_PARTIAL {
                self.partial.clear();
            }
            return Vec::new();
        };
        let rest = self.partial.split_off(last_nl + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        if self.partial.len() > MAX_PARTIAL {
            self.partial.clear();
        }
        String::from_utf8_lossy(&complete)
            .lines()
            .filter_map(parse_xid_line)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn lines_are_read_as_they_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        let mut tail = XidTail::new(path.clone());
        assert!(tail.read().is_empty(), "no file yet: nothing");
        let log = include_str!("../../../fixtures/xid/kmsg/gpud-dmesg-with-xid-119.log");
        let mut f = std::fs::File::create(&path).unwrap();
        let cut = log.find("): 119").unwrap_or_else(|| panic!("no XID")) + 3;
        f.write_all(&log.as_bytes()[..cut]).unwrap();
        f.flush().unwrap();
        assert!(tail.read().is_empty(), "half a line is kept for later");
        f.write_all(&log.as_bytes()[cut..]).unwrap();
        f.flush().unwrap();
        let ev = tail.read();
        assert_eq!(ev.len(), 5);
        assert!(ev.iter().all(|e| e.xid == 119));
        assert!(tail.read().is_empty(), "nothing new");
        // Replaced by a shorter file: read from its start.
        std::fs::write(
            &path,
            "NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.\n",
        )
        .unwrap();
        let ev = tail.read();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].xid, 79);
    }
}
