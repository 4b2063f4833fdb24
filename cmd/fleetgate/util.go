package main

import (
	"maps"
	"slices"
)

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
