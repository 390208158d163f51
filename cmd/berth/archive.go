package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

// writeArchiveFile writes what export streams to out, beside it first and
// renamed once whole: an interrupted export never leaves a file that looks
// complete. It prints the file and its size.
func (a *app) writeArchiveFile(out string, export func(w io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = export(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "%s: %s\n", out, humanBytes(fi.Size()))
	return nil
}

func newTemplateExportCmd(a *app) *cobra.Command {
	return newArchiveExportCmd(a, "export NAME -o FILE", "Write a template as a portable archive (import it on another daemon)",
		"Write a template made from an image, build steps or a Dockerfile as an archive of its "+
			"layers and record (defaults, start command, ready check, isolation). `berth template "+
			"import` makes the same template on another daemon without a registry or a build. "+
			"Admin keys only.",
		"a template name", func(ctx context.Context, c *client.Client, name string, w io.Writer) error {
			return c.ExportTemplate(ctx, name, w)
		})
}

// newArchiveExportCmd is an export command: its one argument (what) exported
// to the file -o names.
func newArchiveExportCmd(a *app, use, short, long, what string, export func(ctx context.Context, c *client.Client, arg string, w io.Writer) error) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  exactArgs(1, what),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return invalidf("-o FILE is required")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.writeArchiveFile(out, func(w io.Writer) error { return export(cmd.Context(), c, args[0], w) })
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "archive file to write")
	return cmd
}

func newTemplateImportCmd(a *app) *cobra.Command {
	var (
		asJSON, replace bool
		name            string
	)
	cmd := &cobra.Command{
		Use:   "import FILE [--name NAME] [--replace]",
		Short: "Make a template from an archive `berth template export` wrote",
		Long: "Make a template from an archive written by `berth template export` (on this or another " +
			"daemon). Every layer's size and SHA-256 and every path in it are checked before the " +
			"template exists; a name the daemon has is refused unless --replace, which puts the " +
			"archive's in its place as a rebuild would (sandboxes of the old one keep it). On a " +
			"Kubernetes gateway the template is made on every Ready node (--replace is refused there). " +
			"Admin keys only.",
		Args: exactArgs(1, "an archive file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			c, err := a.client()
			if err != nil {
				return err
			}
			imp := c.ImportTemplate
			if replace {
				imp = c.ReplaceTemplate
			}
			t, err := imp(cmd.Context(), f, name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.out, t)
			}
			fmt.Fprintf(a.out, "%s: %s, %s\n", t.Name, humanBytes(t.SizeBytes), t.Source)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the template as JSON")
	cmd.Flags().StringVar(&name, "name", "", "the new template's name (default: the archive's)")
	cmd.Flags().BoolVar(&replace, "replace", false, "replace a template of that name the daemon has")
	return cmd
}
