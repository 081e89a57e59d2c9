"""The ``vitstudy`` distribution's own name: :mod:`vitstudy.testing` ships the contract checks every
registered part must pass, for this package's parts and for a plug-in package's alike."""
