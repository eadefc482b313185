//! The InfiniBand port counters the agent exports.

/// InfiniBand counters exported as node_exporter does: (sysfs name, metric suffix, multiplier to base unit, help).
/// The suffix is node_exporter's (`node_infiniband_<suffix>`, labels `device` and `port`) where it exports the
/// counter; `symbol_error_total`, `excessive_buffer_overrun_errors_total` and `local_link_integrity_errors_total`
/// have no counterpart in its output and are named after the sysfs file. `port_rcv_data`/`port_xmit_data` count
/// 4-byte words.
pub(super) const IB_COUNTERS: &[(&str, &str, u64, &str)] = &[
    (
        "port_rcv_data",
        "port_data_received_bytes_total",
        4,
        "Bytes received on the port.",
    ),
    (
        "port_xmit_data",
        "port_data_transmitted_bytes_total",
        4,
        "Bytes transmitted on the port.",
    ),
    (
        "port_rcv_packets",
        "port_packets_received_total",
        1,
        "Packets received on the port.",
    ),
    (
        "port_xmit_packets",
        "port_packets_transmitted_total",
        1,
        "Packets transmitted on the port.",
    ),
    (
        "link_downed",
        "link_downed_total",
        1,
        "Times the link went down.",
    ),
    (
        "link_error_recovery",
        "link_error_recovery_total",
        1,
        "Link error recoveries.",
    ),
    (
        "symbol_error",
        "symbol_error_total",
        1,
        "Minor link errors on the physical lanes.",
    ),
    (
        "port_rcv_errors",
        "port_errors_received_total",
        1,
        "Malformed packets received.",
    ),
    (
        "port_xmit_discards",
        "port_discards_transmitted_total",
        1,
        "Outbound packets discarded.",
    ),
    (
        "port_xmit_wait",
        "port_transmit_wait_total",
        1,
        "Ticks the port had data to send but no credits.",
    ),
    (
        "excessive_buffer_overrun_errors",
        "excessive_buffer_overrun_errors_total",
        1,
        "Buffer overruns.",
    ),
    (
        "local_link_integrity_errors",
        "local_link_integrity_errors_total",
        1,
        "Local link integrity errors.",
    ),
];
