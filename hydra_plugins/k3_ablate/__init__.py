"""k3-ablate's Hydra plugins (Hydra finds plugins only in the `hydra_plugins` namespace): `sweeper`."""
