//! Sets of logical CPU ids (Linux numbering), parsed from and printed as kernel cpulists (`0-3,8,10-11`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest CPU id accepted from a host file. Linux' `NR_CPUS` tops out at 8192; anything beyond is garbage.
pub(crate) const MAX_CPU_ID: u32 = 65_535;

/// Why a cpulist or mask could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    /// A list element is not a number or a `a-b` range.
    #[error("invalid cpulist element {0:?}")]
    Element(String),
    /// A range runs backwards.
    #[error("invalid cpulist range {0}-{1}")]
    Range(u32, u32),
    /// A CPU id beyond [`MAX_CPU_ID`].
    #[error("cpu id {0} is beyond {MAX_CPU_ID}")]
    TooLarge(u64),
    /// A hex mask word is not hexadecimal.
    #[error("invalid cpumask word {0:?}")]
    MaskWord(String),
}

/// A sorted set of CPU ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuSet(Vec<u32>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// A set from any ids (sorted and deduplicated).
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> Self {
        let mut v: Vec<u32> = ids.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self(v)
    }

    /// Parse a kernel cpulist (`0-3,8,10-11`; empty or whitespace means the empty set).
    pub fn parse_list(s: &str) -> Result<Self, CpuListError> {
        let mut ids = Vec::new();
        for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (parse_id(a, part)?, parse_id(b, part)?),
                None => {
                    let a = parse_id(part, part)?;
                    (a, a)
                }
            };
            if b < a {
                return Err(CpuListError::Range(a, b));
            }
            ids.extend(a..=b);
        }
        Ok(Self::from_ids(ids))
    }

    /// Parse a kernel hex cpumask (`00000000,0000ffff`: 32-bit words, most significant first).
    pub fn parse_mask(s: &str) -> Result<Self, CpuListError> {
        let words: Vec<&str> = s.trim().split(',').collect();
        let mut ids = Vec::new();
        for (i, word) in words.iter().rev().enumerate() {
            let word = word.trim().trim_start_matches("0x");
            if word.is_empty() {
                continue;
            }
            let bits = u32::from_str_radix(word, 16)
                .map_err(|_| CpuListError::MaskWord(word.to_owned()))?;
            for bit in 0..32u64 {
                if bits & (1 << bit) != 0 {
                    let id = i as u64 * 32 + bit;
                    if id > u64::from(MAX_CPU_ID) {
                        return Err(CpuListError::TooLarge(id));
                    }
                    ids.push(id as u32);
                }
            }
        }
        Ok(Self::from_ids(ids))
    }

    /// The ids, ascending.
    pub fn ids(&self) -> &[u32] {
        &self.0
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        self.0.binary_search(&id).is_ok()
    }

    /// Whether every CPU of `other` is in `self`.
    pub fn includes(&self, other: &CpuSet) -> bool {
        other.0.iter().all(|id| self.contains(*id))
    }

    /// Whether the two sets share a CPU.
    pub fn intersects(&self, other: &CpuSet) -> bool {
        other.0.iter().any(|id| self.contains(*id))
    }

    /// The union of two sets.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        Self::from_ids(self.0.iter().chain(other.0.iter()).copied())
    }

    /// The smallest id, if any.
    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }
}

fn parse_id(s: &str, element: &str) -> Result<u32, CpuListError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuListError::Element(element.to_owned()));
    }
    let v: u64 = s
        .parse()
        .map_err(|_| CpuListError::Element(element.to_owned()))?;
    if v > u64::from(MAX_CPU_ID) {
        return Err(CpuListError::TooLarge(v));
    }
    Ok(v as u32)
}

/// Compress sorted ids into `a-b` ranges joined by commas.
pub fn format_ranges(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_ranges(&self.0))
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuSet::parse_list(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_lists() -> Result<(), CpuListError> {
        let s = CpuSet::parse_list("0-3,8,10-11\n")?;
        assert_eq!(s.ids(), &[0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!(CpuSet::parse_list("")?.len(), 0);
        assert_eq!(CpuSet::parse_list("5")?.to_string(), "5");
        assert!(CpuSet::parse_list("3-1").is_err());
        assert!(CpuSet::parse_list("a").is_err());
        assert!(CpuSet::parse_list("1-99999999").is_err());
        Ok(())
    }

    #[test]
    fn parses_masks() -> Result<(), CpuListError> {
        assert_eq!(CpuSet::parse_mask("00000000,0000ff00")?.to_string(), "8-15");
        assert_eq!(CpuSet::parse_mask("00000001,00000001")?.to_string(), "0,32");
        assert_eq!(
            CpuSet::parse_mask("0x000000aa,aaaaaaaa")?.to_string(),
            "1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31,33,35,37,39"
        );
        assert!(CpuSet::parse_mask("zz").is_err());
        Ok(())
    }

    proptest! {
        #[test]
        fn list_parser_never_panics(s in ".*") {
            let _ = CpuSet::parse_list(&s);
        }

        #[test]
        fn mask_parser_never_panics(s in "[0-9a-fA-Fx, ]{0,80}") {
            let _ = CpuSet::parse_mask(&s);
        }

        #[test]
        fn list_roundtrips(ids in proptest::collection::vec(0u32..4096, 0..200)) {
            let set = CpuSet::from_ids(ids);
            let again = CpuSet::parse_list(&set.to_string());
            prop_assert_eq!(again.ok(), Some(set));
        }
    }
}
