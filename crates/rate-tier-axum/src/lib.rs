//! Axum glue for tower-rate-tier.
