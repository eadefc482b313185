//! One gres.conf line as a node reports it (without `NodeName=`: the controller adds the names it derived), parsed
//! into typed fields and rendered back from them:
//!
//! | key | value |
//! |---|---|
//! | `Name` (required) | a letter, then letters, digits, `_` |
//! | `Type` | letters, digits, `_ . -` |
//! | `File` or `MultipleFiles` | comma list of absolute paths under the device directory (`/dev`), each optionally ending in a Slurm bracket range: `/dev/nvidia[0-3,6]` |
//! | `Cores` | core id ranges: `0-7,16-23` |
//! | `Links` | comma list of integers 0-255 with exactly one `-1`; only on a line of one device |
//! | `Count` | an integer; equal to the number of files with `File=`, 1 with `MultipleFiles=` |
//! | `Flags` | comma list of the flags Slurm 22.05 knows |

use std::fmt;

use super::{
    LineError, MAX_LIST, Seen, bad, excerpt, is_gres_name, is_word, range_len, ranges, write_ranges,
};

/// The longest device path (before its range).
pub(crate) const MAX_PATH: usize = 256;
/// The largest `Links=` entry (NVLinks between two GPUs; 18 on an H100).
pub(crate) const MAX_LINKS: u32 = 255;

/// A flag of `Flags=` (Slurm 22.05's set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GresFlag {
    /// `CountOnly`.
    CountOnly,
    /// `one_sharing`.
    OneSharing,
    /// `all_sharing`.
    AllSharing,
    /// `nvidia_gpu_env`.
    NvidiaGpuEnv,
    /// `amd_gpu_env`.
    AmdGpuEnv,
    /// `intel_gpu_env`.
    IntelGpuEnv,
    /// `opencl_env`.
    OpenclEnv,
    /// `no_gpu_env`.
    NoGpuEnv,
}

impl GresFlag {
    /// Every flag, in Slurm's spelling.
    pub(crate) const ALL: [(Self, &'static str); 8] = [
        (Self::CountOnly, "CountOnly"),
        (Self::OneSharing, "one_sharing"),
        (Self::AllSharing, "all_sharing"),
        (Self::NvidiaGpuEnv, "nvidia_gpu_env"),
        (Self::AmdGpuEnv, "amd_gpu_env"),
        (Self::IntelGpuEnv, "intel_gpu_env"),
        (Self::OpenclEnv, "opencl_env"),
        (Self::NoGpuEnv, "no_gpu_env"),
    ];

    /// Slurm's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("", |(_, s)| s)
    }
}

/// One path of `File=`/`MultipleFiles=`: a prefix and, when it ends in a bracket range, the range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePattern {
    /// The path, or the part before `[`.
    pub(crate) prefix: String,
    /// The numbers in brackets, in order.
    pub(crate) range: Option<Vec<(u32, u32)>>,
}

impl DevicePattern {
    /// How many files it names.
    pub(crate) fn len(&self) -> u64 {
        self.range.as_deref().map_or(1, range_len)
    }
}

impl fmt::Display for DevicePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.prefix)?;
        if let Some(r) = &self.range {
            let mut s = String::new();
            write_ranges(&mut s, r);
            write!(f, "[{s}]")?;
        }
        Ok(())
    }
}

/// `File=` (one device per file) or `MultipleFiles=` (all the files of one device).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceFiles {
    /// `File=`.
    File(Vec<DevicePattern>),
    /// `MultipleFiles=`.
    Multiple(Vec<DevicePattern>),
}

impl DeviceFiles {
    /// How many devices the files describe.
    pub(crate) fn devices(&self) -> u64 {
        match self {
            Self::File(p) => p.iter().map(DevicePattern::len).sum(),
            Self::Multiple(_) => 1,
        }
    }
}

/// One gres.conf line without `NodeName=`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GresLine {
    /// `Name=`.
    pub name: String,
    /// `Type=`.
    pub(crate) gres_type: Option<String>,
    /// `File=` / `MultipleFiles=`.
    pub(crate) files: Option<DeviceFiles>,
    /// `Cores=` ranges, in order.
    pub(crate) cores: Option<Vec<(u32, u32)>>,
    /// `Links=`.
    pub(crate) links: Option<Vec<i32>>,
    /// `Count=`.
    pub(crate) count: Option<u64>,
    /// `Flags=`, in order.
    pub(crate) flags: Vec<GresFlag>,
}

impl fmt::Display for GresLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name={}", self.name)?;
        if let Some(t) = &self.gres_type {
            write!(f, " Type={t}")?;
        }
        if let Some(files) = &self.files {
            let (key, list) = match files {
                DeviceFiles::File(l) => ("File", l),
                DeviceFiles::Multiple(l) => ("MultipleFiles", l),
            };
            write!(f, " {key}=")?;
            for (i, p) in list.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{p}")?;
            }
        }
        if let Some(c) = &self.cores {
            let mut s = String::new();
            write_ranges(&mut s, c);
            write!(f, " Cores={s}")?;
        }
        if let Some(l) = &self.links {
            let l: Vec<String> = l.iter().map(i32::to_string).collect();
            write!(f, " Links={}", l.join(","))?;
        }
        if let Some(c) = self.count {
            write!(f, " Count={c}")?;
        }
        if !self.flags.is_empty() {
            let l: Vec<&str> = self.flags.iter().map(|f| f.as_str()).collect();
            write!(f, " Flags={}", l.join(","))?;
        }
        Ok(())
    }
}

/// Split at commas outside brackets.
fn items(value: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0u8, 0);
    for (i, c) in value.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            ']' if depth == 1 => depth = 0,
            '[' | ']' => return None,
            ',' if depth == 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    out.push(&value[start..]);
    Some(out)
}

/// A path under `dir`: `dir/seg/seg…`, segments of letters, digits, `_ . -`, never `.` or `..`.
fn clean_path(path: &str, dir: &str) -> bool {
    let Some(rest) = path
        .strip_prefix(dir.trim_end_matches('/'))
        .and_then(|r| r.strip_prefix('/'))
    else {
        return false;
    };
    path.len() <= MAX_PATH
        && !rest.is_empty()
        && rest.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        })
}

fn device_files(
    key: &'static str,
    value: &str,
    dir: &str,
) -> Result<Vec<DevicePattern>, LineError> {
    const WHAT: &str = "a comma list of absolute paths under the device directory, each optionally ending in a \
                        [range]";
    let err = || bad(key, value, WHAT);
    let list = items(value).ok_or_else(err)?;
    if list.len() > MAX_LIST {
        return Err(err());
    }
    let mut out = Vec::with_capacity(list.len());
    let mut total = 0u64;
    for item in list {
        let p = match item.split_once('[') {
            Some((prefix, rest)) => {
                let inner = rest.strip_suffix(']').ok_or_else(err)?;
                if prefix.ends_with('/') || !clean_path(prefix, dir) {
                    return Err(err());
                }
                DevicePattern {
                    prefix: prefix.to_owned(),
                    range: Some(ranges(key, inner, WHAT).map_err(|_| err())?),
                }
            }
            None if clean_path(item, dir) => DevicePattern {
                prefix: item.to_owned(),
                range: None,
            },
            None => return Err(err()),
        };
        total += p.len();
        if total > MAX_LIST as u64 {
            return Err(bad(key, value, "at most 1024 files"));
        }
        out.push(p);
    }
    Ok(out)
}

fn links(value: &str) -> Result<Vec<i32>, LineError> {
    const WHAT: &str = "a comma list of integers from 0 to 255 with exactly one -1";
    let list: Vec<&str> = value.split(',').collect();
    if list.len() > MAX_LIST {
        return Err(bad("Links", value, WHAT));
    }
    let parsed: Vec<i32> = list
        .into_iter()
        .map(|v| match v {
            "-1" => Ok(-1),
            _ => super::number("Links", v, 0, u64::from(MAX_LINKS), WHAT).map(|n| n as i32),
        })
        .collect::<Result<_, _>>()
        .map_err(|_| bad("Links", value, WHAT))?;
    if parsed.iter().filter(|&&l| l == -1).count() != 1 {
        return Err(bad("Links", value, WHAT));
    }
    Ok(parsed)
}

impl GresLine {
    /// Parse one reported line; device files must lie under `device_dir` (`/dev` on a node).
    pub fn parse(line: &str, device_dir: &str) -> Result<Self, LineError> {
        let mut seen = Seen::default();
        let mut g = Self {
            name: String::new(),
            gres_type: None,
            files: None,
            cores: None,
            links: None,
            count: None,
            flags: Vec::new(),
        };
        for (k, v) in super::tokens(line)? {
            match k {
                "Name" => {
                    seen.first("Name")?;
                    if !is_gres_name(v) {
                        return Err(bad("Name", v, "a letter, then letters, digits and _"));
                    }
                    g.name = v.to_owned();
                }
                "Type" => {
                    seen.first("Type")?;
                    if !is_word(v) {
                        return Err(bad("Type", v, "letters, digits, _ . -"));
                    }
                    g.gres_type = Some(v.to_owned());
                }
                "File" | "MultipleFiles" => {
                    seen.first("File or MultipleFiles")?;
                    g.files = Some(if k == "File" {
                        DeviceFiles::File(device_files("File", v, device_dir)?)
                    } else {
                        DeviceFiles::Multiple(device_files("MultipleFiles", v, device_dir)?)
                    });
                }
                "Cores" => {
                    seen.first("Cores")?;
                    g.cores = Some(ranges("Cores", v, "core id ranges such as 0-7,16-23")?);
                }
                "Links" => {
                    seen.first("Links")?;
                    g.links = Some(links(v)?);
                }
                "Count" => {
                    seen.first("Count")?;
                    g.count = Some(super::number(
                        "Count",
                        v,
                        1,
                        u64::from(u32::MAX),
                        "an integer from 1 to 2^32-1",
                    )?);
                }
                "Flags" => {
                    seen.first("Flags")?;
                    g.flags = v
                        .split(',')
                        .map(|f| {
                            GresFlag::ALL
                                .iter()
                                .find(|(_, s)| *s == f)
                                .map(|(flag, _)| *flag)
                                .ok_or_else(|| bad("Flags", v, "flags Slurm knows"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                other => return Err(LineError::UnknownKey(excerpt(other))),
            }
        }
        if g.name.is_empty() {
            return Err(LineError::Missing("Name"));
        }
        let devices = g.files.as_ref().map(DeviceFiles::devices);
        if let (Some(c), Some(d)) = (g.count, devices) {
            if c != d {
                return Err(LineError::Inconsistent(format!(
                    "Count={c} but the files describe {d} device(s)"
                )));
            }
        }
        if g.links.is_some() && devices.unwrap_or(g.count.unwrap_or(1)) != 1 {
            return Err(LineError::Inconsistent(
                "Links= on a line of more than one device".into(),
            ));
        }
        Ok(g)
    }

    #[cfg(test)]
    /// How many devices the line describes: its files, else `Count=`, else 1.
    pub(crate) fn devices(&self) -> u64 {
        self.files
            .as_ref()
            .map(DeviceFiles::devices)
            .or(self.count)
            .unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> GresLine {
        GresLine::parse(line, "/dev").unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn what_the_agent_writes_round_trips() {
        for line in [
            "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia0 Cores=0-7 Links=-1,0,0,0,0,0,0,0",
            "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia[0-3,6] Cores=0-7,16-23",
            "Name=gpu Type=nvidia_a100_3g.40gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 Cores=0-15 Links=-1,0",
            "Name=gpu Type=MI300X File=/dev/dri/renderD128 Links=0,-1",
            "Name=npu Type=ascend910b File=/dev/davinci[0-7]",
            "Name=hca Type=mt4129 File=/dev/infiniband/uverbs0,/dev/infiniband/uverbs2",
            "Name=mps File=/dev/nvidia[0-99] Count=100",
            "Name=bandwidth Count=4096 Flags=CountOnly",
        ] {
            let g = ok(line);
            assert_eq!(g.to_string(), line);
        }
        assert_eq!(ok("Name=gpu File=/dev/nvidia[0-7]").devices(), 8);
    }

    #[test]
    fn everything_else_is_refused() {
        for line in [
            "NodeName=gpu[001-999] Name=gpu File=/dev/null Count=64",
            "Name=gpu File=/dev/null Count=64",
            "Name=gpu File=/dev/nvidia0\nNodeName=x Name=gpu File=/dev/sda",
            "Name=gpu File=/dev/nvidia0 # x",
            "Name=gpu File=nvidia0",
            "Name=gpu File=/tmp/nvidia0",
            "Name=gpu File=/dev/../etc/shadow",
            "Name=gpu File=/dev//nvidia0",
            "Name=gpu File=/dev/nvidia[0-3",
            "Name=gpu File=/dev/nvidia[3-0]",
            "Name=gpu File=/dev/nvidia[0-3]x",
            "Name=gpu File=/dev/[0-3]/x",
            "Name=gpu File=/dev/nvidia[0-99999]",
            "Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia1",
            "Name=gpu File=/dev/nvidia[0-1] Links=-1,0",
            "Name=gpu File=/dev/nvidia0 Links=0,0",
            "Name=gpu File=/dev/nvidia0 Links=-1,-1",
            "Name=gpu File=/dev/nvidia0 Links=-1,256",
            "Name=gpu File=/dev/nvidia0 Flags=evil",
            "Name=gpu File=/dev/nvidia0 AutoDetect=nvml",
            "Name=gpu Type=a:b File=/dev/nvidia0",
            "Name=g-pu File=/dev/nvidia0",
            "Type=h100 File=/dev/nvidia0",
            "Name=gpu Name=npu",
            "Name=gpu Cores=0-7,x",
            "Name=gpu Count=0",
            "Name=gpu File=\"/dev/nvidia0\"",
        ] {
            assert!(GresLine::parse(line, "/dev").is_err(), "{line:?}");
        }
        assert!(GresLine::parse("Name=gpu File=/tmp/x/dev/nvidia0", "/tmp/x/dev").is_ok());
        assert!(GresLine::parse("Name=gpu File=/tmp/x/dev/nvidia0", "/tmp/x").is_ok());
        assert!(GresLine::parse("Name=gpu File=/tmp/xy/nvidia0", "/tmp/x").is_err());
    }
}
