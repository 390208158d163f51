package workspace

import "testing"

func TestPickRef(t *testing.T) {
	a, b, c := "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222", "3333333333333333333333333333333333333333"
	out := a + "\trefs/heads/v1\n" + b + "\trefs/tags/v1\n" + c + "\trefs/tags/v1^{}\n" + a + "\trefs/heads/main\n"
	tests := []struct{ ref, want string }{
		{"v1", c},   // the peeled annotated tag wins
		{"main", a}, // a branch
		{"nope", ""},
	}
	for _, tt := range tests {
		if got := pickRef(out, tt.ref); got != tt.want {
			t.Errorf("pickRef(%q) = %q, want %q", tt.ref, got, tt.want)
		}
	}
	if got := pickRef("garbage\tline\nzz\trefs/heads/main\n", "main"); got != "" {
		t.Errorf("pickRef(malformed) = %q, want none", got)
	}
}
