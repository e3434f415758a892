"""The attribution of a sweep's all-off to all-on difference to its toggles: the math (`shapley.py`: Shapley values,
add-one-in, leave-one-out, main effects, interactions, bootstrap), the sweep's check, table and files (`sweep.py`,
`python -m ablations.attribution SWEEP_DIR`), the intervals over draws of the assumed figures (`draws.py`), the
frontier-artefact flag (`artefacts.py`) and the plots (`plots.py`). DESIGN.md, "Attribution: the formulas"."""
