package cli

import "strings"

// Nearest is the candidate within two edits of name (a typo: serv, stauts, lsit), or one that
// name is a prefix of, or "" when none is close: what "did you mean" suggests, for commands,
// subcommands and flags alike.
func Nearest(name string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		d := editDistance(name, c)
		if len(name) >= 2 && strings.HasPrefix(c, name) {
			d = min(d, 1)
		}
		if d < bestDist || d == bestDist && c < best {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, by bytes (command names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
