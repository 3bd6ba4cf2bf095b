//! The piece of Prometheus's text exposition every part of the relay writes its series with:
//! the header of a metric family. A module of its own, using nothing of the relay, so that the
//! parts that render their series (health, lakes, the metrics server) need not import each
//! other.

use std::fmt::Write as _;

/// Writes the `# HELP` and `# TYPE` lines of metric `ledger_relay_{name}`: a counter when its
/// name ends in `_total`, else a gauge.
pub(crate) fn family(out: &mut String, name: &str, help: &str) {
    let kind = if name.ends_with("_total") {
        "counter"
    } else {
        "gauge"
    };
    let _ = writeln!(out, "# HELP ledger_relay_{name} {help}");
    let _ = writeln!(out, "# TYPE ledger_relay_{name} {kind}");
}
