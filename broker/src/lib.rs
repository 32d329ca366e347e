//! Ringlog broker.
