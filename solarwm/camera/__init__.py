"""Camera geometry: SE(3)/Sim(3), conventions, intrinsics, integrity checks and trajectories."""
