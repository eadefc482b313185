//! Device health: the XID classification and the detection of failed devices, as pure functions of what the
//! probes read (the agent does the I/O and publishes the findings).

pub mod detect;
pub mod kmsg;
pub mod ports;
pub mod xid;
