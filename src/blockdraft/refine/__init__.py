"""Draft refinement (Kim et al. 2024): rescore a drafter's top-k lattice with an n-gram or a small neural LM."""
