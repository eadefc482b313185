//! A dynamic node's place in the Slurm topology (Slurm 25.05 and later): the `Topology=` value of its
//! `slurmd -Z --conf`, `<topology>:<unit>[:<unit>...][,<topology>:<unit>...]`, where the unit is the leaf switch or
//! block the node sits in (intermediate switches may follow the leaf, as slurm.conf(5) allows). The value reaches
//! slurmd's command line, so it is read against the grammar of the names the controller writes into topology.yaml
//! (lower-case letters, digits and `-`, at most 63 characters) and nothing else gets through.

use std::fmt;

/// How many `<topology>:<unit>` pairs one node may name (isthmus writes two topologies).
const MAX_PAIRS: usize = 8;
/// How many switch names one pair may hold (the leaf and the switches above it).
const MAX_UNITS: usize = 8;

/// Why a `Topology=` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyUnitError {
    /// No pair at all.
    #[error("empty topology value")]
    Empty,
    /// Too many pairs or units.
    #[error(
        "too many topologies or switches (at most {MAX_PAIRS} pairs of at most {MAX_UNITS} units)"
    )]
    TooMany,
    /// A pair without a unit.
    #[error("{0:?} is not <topology>:<unit>")]
    NotAPair(String),
    /// A name outside the grammar.
    #[error(
        "{0:?} is not a topology or unit name (lower-case letters, digits and '-', at most 63 characters, as \
         isthmus names switches and blocks)"
    )]
    BadName(String),
    /// The same topology twice.
    #[error("topology {0:?} is named twice")]
    Repeated(String),
}

/// A checked `Topology=` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopologyUnits(String);

/// A name as the controller writes switch, block and topology names.
fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl TopologyUnits {
    /// Read `value` against the grammar.
    pub(crate) fn parse(value: &str) -> Result<Self, TopologyUnitError> {
        if value.is_empty() {
            return Err(TopologyUnitError::Empty);
        }
        let pairs: Vec<&str> = value.split(',').collect();
        if pairs.len() > MAX_PAIRS {
            return Err(TopologyUnitError::TooMany);
        }
        let mut seen = Vec::new();
        for pair in pairs {
            let parts: Vec<&str> = pair.split(':').collect();
            let [topology, units @ ..] = parts.as_slice() else {
                return Err(TopologyUnitError::NotAPair(pair.to_owned()));
            };
            if units.is_empty() {
                return Err(TopologyUnitError::NotAPair(pair.to_owned()));
            }
            if units.len() > MAX_UNITS {
                return Err(TopologyUnitError::TooMany);
            }
            if let Some(bad) = parts.iter().find(|p| !name_ok(p)) {
                return Err(TopologyUnitError::BadName((*bad).to_owned()));
            }
            if seen.contains(topology) {
                return Err(TopologyUnitError::Repeated((*topology).to_owned()));
            }
            seen.push(topology);
        }
        Ok(Self(value.to_owned()))
    }

    /// The value, as it goes after `Topology=`.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TopologyUnits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_names_the_controller_writes_and_nothing_else() {
        for good in [
            "isthmus-tree:ib-leaf-01",
            "isthmus-tree:leaf-1:spine-1,isthmus-block:nvl-x1",
            "t:a",
        ] {
            assert_eq!(
                TopologyUnits::parse(good).map(|t| t.to_string()),
                Ok(good.to_owned())
            );
        }
        let long = "a".repeat(64);
        for (bad, why) in [
            ("", TopologyUnitError::Empty),
            (
                "isthmus-tree",
                TopologyUnitError::NotAPair("isthmus-tree".into()),
            ),
            ("isthmus-tree:", TopologyUnitError::BadName(String::new())),
            (":leaf", TopologyUnitError::BadName(String::new())),
            ("t:leaf ", TopologyUnitError::BadName("leaf ".into())),
            // What would add a key to slurmd's --conf, or a second node definition.
            (
                "t:leaf Gres=gpu:9",
                TopologyUnitError::BadName("leaf Gres=gpu".into()),
            ),
            (
                "t:a\nNodeName=x",
                TopologyUnitError::BadName("a\nNodeName=x".into()),
            ),
            ("t:Leaf_1", TopologyUnitError::BadName("Leaf_1".into())),
            ("t:a,t:b", TopologyUnitError::Repeated("t".into())),
            ("t:a,,u:b", TopologyUnitError::NotAPair(String::new())),
        ] {
            assert_eq!(TopologyUnits::parse(bad), Err(why), "{bad:?}");
        }
        assert_eq!(
            TopologyUnits::parse(&format!("t:{long}")),
            Err(TopologyUnitError::BadName(long))
        );
        assert_eq!(
            TopologyUnits::parse(&["t:a"; 9].join(",")),
            Err(TopologyUnitError::TooMany)
        );
        assert_eq!(
            TopologyUnits::parse(&format!("t{}", ":a".repeat(9))),
            Err(TopologyUnitError::TooMany)
        );
    }
}
