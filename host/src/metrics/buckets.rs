//! Histogram bucket bounds the subsystems share; a leaf, so a subsystem's
//! metrics never import the registry that imports them.

/// Bucket bounds in seconds for lag histograms (the relay's, consumers',
/// and plugins' outbound HTTP).
pub const LAG_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];
