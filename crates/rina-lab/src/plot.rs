//! Plots of a run (being written).
