//! Storage for tower-rate-tier.
