//! The shipped hwloc fixtures (`fixtures/hwloc`) and the output hwloc 2.9.0 prints for each.

use std::path::PathBuf;

use crate::{fixtures, parse_env_file};

/// One hwloc fixture and its expected output.
#[derive(Debug, Clone)]
pub struct HwlocCase {
    /// Directory name under `fixtures/hwloc`.
    pub name: &'static str,
    /// Expected output file (console or XML) under `expected-hwloc-2.9.0/`.
    pub expected: &'static str,
    /// Environment file beside it, if any.
    pub env: Option<&'static str>,
}

/// Every shipped hwloc fixture with the expected output that describes its default topology.
pub const HWLOC_CASES: &[HwlocCase] = &[
    HwlocCase {
        name: "128arm-2pa2n8cluster4co",
        expected: "128arm-2pa2n8cluster4co.output",
        env: None,
    },
    HwlocCase {
        name: "16amd64-4n4c-cgroup-distance-merge",
        expected: "16amd64-4n4c-cgroup-distance-merge.output",
        env: None,
    },
    HwlocCase {
        name: "16em64t-4s2c2t",
        expected: "16em64t-4s2c2t.output",
        env: None,
    },
    HwlocCase {
        name: "2amd64-2n",
        expected: "2amd64-2n.output",
        env: None,
    },
    HwlocCase {
        name: "32amd64-4s2n4c-cgroup2",
        expected: "32amd64-4s2n4c-cgroup2.output",
        env: None,
    },
    HwlocCase {
        name: "32em64t-2n8c+dax+nvme+mic+dimms",
        expected: "32em64t-2n8c+1mic.output",
        env: None,
    },
    HwlocCase {
        name: "32intel64-2p8co2t+8ve",
        expected: "32intel64-2p8co2t+8ve.output",
        env: None,
    },
    HwlocCase {
        name: "40intel64-2g2n4c+pcilocality",
        expected: "40intel64-2g2n4c+pci.output",
        env: Some("40intel64-2g2n4c+pci.env"),
    },
    HwlocCase {
        name: "48amd64-4pa2n6c-sparse",
        expected: "48amd64-4d2n6c-sparse.output",
        env: None,
    },
    HwlocCase {
        name: "64amd64-4s2n4ca2co",
        expected: "64amd64-4s2n4ca2co.output",
        env: None,
    },
    HwlocCase {
        name: "8em64t-2s2ca2c",
        expected: "8em64t-2s2ca2c.output",
        env: None,
    },
    HwlocCase {
        name: "nvidiagpunumanodes",
        expected: "nvidiagpunumanodes.output",
        env: None,
    },
    HwlocCase {
        name: "offline-cpu0-node0",
        expected: "offline-cpu0-node0.output",
        env: None,
    },
];

impl HwlocCase {
    /// The fixture directory.
    pub fn dir(&self) -> PathBuf {
        fixtures().join("hwloc").join(self.name)
    }

    /// The tarball.
    pub fn tarball(&self) -> PathBuf {
        self.dir().join(format!("{}.tar.bz2", self.name))
    }

    /// The expected output text.
    pub fn expected_text(&self) -> String {
        let p = self.dir().join("expected-hwloc-2.9.0").join(self.expected);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// Extra environment for hwloc (and so for isthmus and slurmd).
    pub fn env(&self) -> Vec<(String, String)> {
        self.env
            .map(|f| {
                let p = self.dir().join("expected-hwloc-2.9.0").join(f);
                parse_env_file(
                    &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
                )
            })
            .unwrap_or_default()
    }
}
