// Package study holds what is built from many runs of the simulator
// (internal/sim): sweeps and their plots, the reproductions of the
// papers' figures (`rxlane sim figures`), the FALCON study over core
// counts, the highest sustained rate by bisection, and the fit of
// calibrate_scale against a measured rate. The model itself, one run of
// one scenario, stays in internal/sim.
package study
