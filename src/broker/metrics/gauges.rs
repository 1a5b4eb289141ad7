//! Scrape-time gauges: values read from the node as the scrape runs,
//! written straight into the exposition.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// One gauge without labels.
pub fn gauge<N: EncodeGaugeValue>(e: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A gauge per label set.
pub fn gauges<L: EncodeLabelSet, N: EncodeGaugeValue + Copy>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: impl IntoIterator<Item = (L, N)>,
) -> fmt::Result {
    let mut f = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (l, v) in items {
        ConstGauge::new(v).encode(f.encode_family(&l)?)?;
    }
    Ok(())
}
