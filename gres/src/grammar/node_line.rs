//! A node definition as a node reports it (`[NodeName=<n>] CPUs=… Boards=… SocketsPerBoard=… CoresPerSocket=…
//! ThreadsPerCore=… RealMemory=… [Gres=…] [Features=…] [NodeAddr=…]`, what [`crate::node_def::node_line`] writes),
//! parsed into typed fields and rendered back without `NodeName=` and `NodeAddr=`: the host name and address are
//! not the node's to declare (the caller names the node from the cluster).

use std::fmt;

use super::{LineError, Seen, bad, excerpt, is_gres_name, is_slurm_hostname, is_word};

/// Largest `CPUs=` (and product of Boards, SocketsPerBoard, CoresPerSocket and ThreadsPerCore): Slurm 22.05 keeps
/// CPU counts in 16 bits.
pub(crate) const MAX_CPUS: u64 = u16::MAX as u64;
/// Largest `RealMemory=` in MiB (4 PiB).
pub(crate) const MAX_REAL_MEMORY_MIB: u64 = 1 << 32;
/// Largest count of one GRES in `Gres=`.
pub(crate) const MAX_GRES_COUNT: u64 = u16::MAX as u64;
/// Most entries of `Gres=` and of `Features=`.
pub(crate) const MAX_ENTRIES: usize = 64;

/// One `Gres=` entry: `name[:type]:count`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GresCount {
    /// GRES name (`gpu`).
    pub(crate) name: String,
    /// Type (`nvidia_h100_80gb_hbm3`).
    pub(crate) gres_type: Option<String>,
    /// How many.
    pub(crate) count: u64,
}

impl fmt::Display for GresCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gres_type {
            Some(t) => write!(f, "{}:{t}:{}", self.name, self.count),
            None => write!(f, "{}:{}", self.name, self.count),
        }
    }
}

/// The node's hardware as slurm.conf describes it; displayed as the attributes after `NodeName=<name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeDefinition {
    /// `CPUs=`.
    pub(crate) cpus: u32,
    /// `Boards=`.
    pub(crate) boards: u32,
    /// `SocketsPerBoard=`.
    pub(crate) sockets_per_board: u32,
    /// `CoresPerSocket=`.
    pub(crate) cores_per_socket: u32,
    /// `ThreadsPerCore=`.
    pub(crate) threads_per_core: u32,
    /// `RealMemory=` (MiB).
    pub real_memory_mib: u64,
    /// `Gres=`, in the order given.
    pub(crate) gres: Vec<GresCount>,
    /// `Features=`, in the order given.
    pub(crate) features: Vec<String>,
}

impl fmt::Display for NodeDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CPUs={} Boards={} SocketsPerBoard={} CoresPerSocket={} ThreadsPerCore={} RealMemory={}",
            self.cpus,
            self.boards,
            self.sockets_per_board,
            self.cores_per_socket,
            self.threads_per_core,
            self.real_memory_mib
        )?;
        if !self.gres.is_empty() {
            f.write_str(" Gres=")?;
            for (i, g) in self.gres.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{g}")?;
            }
        }
        if !self.features.is_empty() {
            write!(f, " Features={}", self.features.join(","))?;
        }
        Ok(())
    }
}

fn gres_entry(value: &str, item: &str) -> Result<GresCount, LineError> {
    const WHAT: &str = "a comma list of name[:type]:count (name: a letter then letters, digits, _; type: letters, \
                        digits, _ . -; count 1-65535)";
    let parts: Vec<&str> = item.split(':').collect();
    let (name, gres_type, count) = match parts.as_slice() {
        [n, c] => (*n, None, *c),
        [n, t, c] => (*n, Some(*t), *c),
        _ => return Err(bad("Gres", value, WHAT)),
    };
    if !is_gres_name(name) || gres_type.is_some_and(|t| !is_word(t)) {
        return Err(bad("Gres", value, WHAT));
    }
    let count = super::number("Gres", count, 1, MAX_GRES_COUNT, WHAT)
        .map_err(|_| bad("Gres", value, WHAT))?;
    Ok(GresCount {
        name: name.to_owned(),
        gres_type: gres_type.map(str::to_owned),
        count,
    })
}

impl NodeDefinition {
    /// Parse a reported node line (see the module documentation). `NodeName=` and `NodeAddr=` are checked and
    /// dropped.
    pub fn parse(line: &str) -> Result<Self, LineError> {
        const INT: &str = "an integer from 1 to 65535";
        let mut seen = Seen::default();
        let (mut cpus, mut boards, mut sockets, mut cores, mut threads, mut memory) =
            (None, None, None, None, None, None);
        let mut gres = Vec::new();
        let mut features: Vec<String> = Vec::new();
        let small =
            |key: &'static str, v: &str| super::number(key, v, 1, MAX_CPUS, INT).map(|n| n as u32);
        for (k, v) in super::tokens(line)? {
            match k {
                "NodeName" => {
                    seen.first("NodeName")?;
                    if !is_slurm_hostname(v) {
                        return Err(bad("NodeName", v, "one host name"));
                    }
                }
                "NodeAddr" => {
                    seen.first("NodeAddr")?;
                    if v.parse::<std::net::IpAddr>().is_err() && !is_slurm_hostname(v) {
                        return Err(bad("NodeAddr", v, "one IP address or host name"));
                    }
                }
                "CPUs" => {
                    seen.first("CPUs")?;
                    cpus = Some(small("CPUs", v)?);
                }
                "Boards" => {
                    seen.first("Boards")?;
                    boards = Some(small("Boards", v)?);
                }
                "SocketsPerBoard" => {
                    seen.first("SocketsPerBoard")?;
                    sockets = Some(small("SocketsPerBoard", v)?);
                }
                "CoresPerSocket" => {
                    seen.first("CoresPerSocket")?;
                    cores = Some(small("CoresPerSocket", v)?);
                }
                "ThreadsPerCore" => {
                    seen.first("ThreadsPerCore")?;
                    threads = Some(small("ThreadsPerCore", v)?);
                }
                "RealMemory" => {
                    seen.first("RealMemory")?;
                    memory = Some(super::number(
                        "RealMemory",
                        v,
                        1,
                        MAX_REAL_MEMORY_MIB,
                        "an integer number of MiB from 1 to 2^32",
                    )?);
                }
                "Gres" => {
                    seen.first("Gres")?;
                    let items: Vec<&str> = v.split(',').collect();
                    if items.len() > MAX_ENTRIES {
                        return Err(bad("Gres", v, "at most 64 entries"));
                    }
                    gres = items
                        .into_iter()
                        .map(|i| gres_entry(v, i))
                        .collect::<Result<_, _>>()?;
                }
                "Features" => {
                    seen.first("Features")?;
                    let items: Vec<&str> = v.split(',').collect();
                    if items.len() > MAX_ENTRIES || !items.iter().all(|f| is_word(f)) {
                        return Err(bad(
                            "Features",
                            v,
                            "a comma list of at most 64 words of letters, digits, _ . -",
                        ));
                    }
                    features = items.into_iter().map(str::to_owned).collect();
                }
                other => return Err(LineError::UnknownKey(excerpt(other))),
            }
        }
        let need = |v: Option<u32>, key: &'static str| v.ok_or(LineError::Missing(key));
        let def = Self {
            cpus: need(cpus, "CPUs")?,
            boards: need(boards, "Boards")?,
            sockets_per_board: need(sockets, "SocketsPerBoard")?,
            cores_per_socket: need(cores, "CoresPerSocket")?,
            threads_per_core: need(threads, "ThreadsPerCore")?,
            real_memory_mib: memory.ok_or(LineError::Missing("RealMemory"))?,
            gres,
            features,
        };
        let product = [
            def.boards,
            def.sockets_per_board,
            def.cores_per_socket,
            def.threads_per_core,
        ]
        .iter()
        .map(|&n| u64::from(n))
        .product::<u64>();
        if product > MAX_CPUS {
            return Err(LineError::Inconsistent(format!(
                "Boards × SocketsPerBoard × CoresPerSocket × ThreadsPerCore = {product}, more than {MAX_CPUS}"
            )));
        }
        Ok(def)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: &str = "NodeName=gpu001 CPUs=32 Boards=1 SocketsPerBoard=2 CoresPerSocket=8 ThreadsPerCore=2 \
                        RealMemory=93113 Gres=gpu:nvidia_h100_80gb_hbm3:8 Features=nvidia_h100_80gb_hbm3,nvswitch,ib";

    #[test]
    fn the_agents_line_round_trips_without_its_name() -> Result<(), LineError> {
        let d = NodeDefinition::parse(H100)?;
        assert_eq!(d.cpus, 32);
        assert_eq!(d.real_memory_mib, 93113);
        assert_eq!(d.gres[0].count, 8);
        assert_eq!(d.to_string(), H100.trim_start_matches("NodeName=gpu001 "));
        assert_eq!(NodeDefinition::parse(&d.to_string())?, d);
        let with_addr = format!("{H100} NodeAddr=10.0.0.11");
        assert_eq!(NodeDefinition::parse(&with_addr)?, d);
        Ok(())
    }

    #[test]
    fn everything_else_is_refused() {
        let base =
            "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000";
        for bad in [
            format!("{base}\nHealthCheckProgram=/tmp/x.sh"),
            format!("{base} HealthCheckProgram=/tmp/x.sh"),
            format!("{base} Weight=1"),
            format!("NodeName=gpu[001-999] {base}"),
            format!("NodeName=a NodeName=b {base}"),
            format!("{base} CPUs=9"),
            format!("{base} Features=a,,b"),
            format!("{base} Features=a#b"),
            format!("{base} Gres=gpu:h100:0"),
            format!("{base} Gres=gpu:h:1:2"),
            format!("{base} Gres=1gpu:1"),
            format!("{base} NodeAddr=a,b"),
            base.replace("CPUs=8", "CPUs=0"),
            base.replace("CPUs=8", "CPUs=65536"),
            base.replace("CPUs=8", "CPUs=08"),
            base.replace("RealMemory=1000", "RealMemory=1000M"),
            base.replace(" RealMemory=1000", ""),
            base.replace(
                "CoresPerSocket=8 ThreadsPerCore=1",
                "CoresPerSocket=60000 ThreadsPerCore=2",
            ),
            format!("{base} Features=\"x\""),
        ] {
            assert!(NodeDefinition::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
