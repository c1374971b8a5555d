"""The foundation every other package stands on: errors, files written whole, the device mesh
and placement rules, several processes, host devices, the compile cache, quiet logging. It
imports nothing else from ragen_jax."""
