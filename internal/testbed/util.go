package testbed

import (
	"os"
	"strings"
)

func readFileTrim(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}
