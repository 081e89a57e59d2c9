"""Measurement: streamed covariance spectra through hooks, spectral metrics, activation observables."""
