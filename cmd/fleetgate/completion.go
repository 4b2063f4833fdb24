package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// The shell completions and the manual page are generated from the
// commands' help text (--help of every command and verb), so that they
// list what the binary takes.

// verbs are the subcommands of the commands that have them.
var verbs = map[string][]string{"devices": {"get", "list", "add", "rotate", "remove", "forget"}, "events": {"tail"}, "completion": {"bash", "zsh"}}

// cliCommand is one command (or command and verb) as its help tells it.
type cliCommand struct {
	path     []string // "devices", "get"
	summary  string
	synopsis string // after "usage: fleetgate "
	flags    []cliFlag
}

func (c cliCommand) name() string { return strings.Join(c.path, " ") }

// cliFlag is one flag of a command's help.
type cliFlag struct {
	names []string // "-c", "--config"
	arg   string   // "FILE"; "" for a switch
	help  string
}

var (
	helpSynopsis = regexp.MustCompile(`(?m)^usage: fleetgate (.*)$`)
	helpFlag     = regexp.MustCompile(`(?m)^  ((?:-\w, )?--?[\w-]+)(?: (\S+))?\n    \t(.*)$`)
)

// cliCommands reads the help of every command and verb.
func cliCommands() []cliCommand {
	var out []cliCommand
	for _, c := range commands() {
		paths := [][]string{{c.name}}
		if vs, ok := verbs[c.name]; ok {
			paths = paths[:0]
			for _, v := range vs {
				paths = append(paths, []string{c.name, v})
			}
		}
		for _, p := range paths {
			var help bytes.Buffer
			dispatch(context.Background(), append(slices.Clone(p), "--help"), &help, io.Discard)
			out = append(out, parseHelp(p, c.summary, help.String()))
		}
	}
	return out
}

// parseHelp reads a command's usage and flags from its help text.
func parseHelp(path []string, summary, help string) cliCommand {
	c := cliCommand{path: path, summary: summary}
	if m := helpSynopsis.FindStringSubmatch(help); m != nil {
		c.synopsis = m[1]
	}
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		c.flags = append(c.flags, cliFlag{names: strings.Split(m[1], ", "), arg: m[2], help: m[3]})
	}
	return c
}

func cmdCompletion(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newBareFlags("completion", "completion bash|zsh\n\n"+
		"Prints the shell completion script. bash: source it, or put it in\n"+
		"/usr/share/bash-completion/completions/fleetgate. zsh: put it as _fleetgate\n"+
		"in a directory of $fpath.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want 'completion bash' or 'completion zsh'", errUsage)
	}
	switch fs.Arg(0) {
	case "bash":
		_, err := io.WriteString(stdout, bashCompletion(cliCommands()))
		return err
	case "zsh":
		_, err := io.WriteString(stdout, zshCompletion(cliCommands()))
		return err
	}
	return fmt.Errorf("%w: shell %q: want bash or zsh", errUsage, fs.Arg(0))
}

// valueWords are the words a flag's value is completed from, by its
// argument's name; files for FILE.
var valueWords = map[string]string{"STATE": "online suspect offline", "ORDER": "id changed"}

// bashCompletion is the bash completion script for cmds.
func bashCompletion(cmds []cliCommand) string {
	var b strings.Builder
	b.WriteString(`# bash completion for fleetgate; generated from its help by 'fleetgate completion bash'.
_fleetgate() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local cmd= i w skip=
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if [[ -n $skip ]]; then skip=; continue; fi
		case $w in
		-*) [[ " $_fleetgate_valued " == *" $w "* ]] && skip=1 ;;
		*) if [[ -z $cmd ]]; then cmd=$w; elif [[ " $_fleetgate_verbs " == *" $cmd "* && $cmd != *" "* ]]; then cmd="$cmd $w"; fi ;;
		esac
	done
	case $prev in
`)
	valued := map[string]bool{}
	byArg := map[string][]string{}
	for _, c := range cmds {
		for _, f := range c.flags {
			if f.arg == "" {
				continue
			}
			for _, n := range f.names {
				if !valued[n] {
					valued[n] = true
					byArg[f.arg] = append(byArg[f.arg], n)
				}
			}
		}
	}
	for _, arg := range sortedKeysOf(byArg) {
		names := byArg[arg]
		switch {
		case arg == "FILE":
			fmt.Fprintf(&b, "\t%s) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n", strings.Join(names, "|"))
		case valueWords[arg] != "":
			fmt.Fprintf(&b, "\t%s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", strings.Join(names, "|"), valueWords[arg])
		default:
			fmt.Fprintf(&b, "\t%s) return ;;\n", strings.Join(names, "|"))
		}
	}
	b.WriteString("\tesac\n\tcase $cmd in\n")
	var top []string
	for _, c := range commands() {
		top = append(top, c.name)
	}
	fmt.Fprintf(&b, "\t'') COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(append(top, "help", "--help", "--version"), " "))
	for _, name := range sortedKeysOf(verbs) {
		fmt.Fprintf(&b, "\t%s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", name, strings.Join(verbs[name], " "))
	}
	for _, c := range cmds {
		words := []string{"--help"}
		for _, f := range c.flags {
			words = append(words, f.names...)
		}
		fmt.Fprintf(&b, "\t%q) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", c.name(), strings.Join(words, " "))
	}
	b.WriteString("\tesac\n}\n")
	fmt.Fprintf(&b, "_fleetgate_valued=%q\n", strings.Join(sortedKeysOf(valued), " "))
	fmt.Fprintf(&b, "_fleetgate_verbs=%q\n", strings.Join(sortedKeysOf(verbs), " "))
	b.WriteString("complete -F _fleetgate fleetgate\n")
	return b.String()
}

// zshCompletion is the zsh completion script (_fleetgate) for cmds.
func zshCompletion(cmds []cliCommand) string {
	var b strings.Builder
	b.WriteString("#compdef fleetgate\n# zsh completion for fleetgate; generated from its help by 'fleetgate completion zsh'.\n")
	b.WriteString("_fleetgate() {\n\tlocal -a cmds\n\tcmds=(\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "\t\t%s\n", zshQuote(c.name+":"+c.summary))
	}
	b.WriteString("\t)\n\tif (( CURRENT == 2 )); then\n\t\t_describe -t commands 'fleetgate command' cmds\n\t\treturn\n\tfi\n")
	b.WriteString("\tlocal cmd=${words[2]}\n\tshift words\n\t(( CURRENT-- ))\n\tcase $cmd in\n")
	for _, name := range sortedKeysOf(verbs) {
		fmt.Fprintf(&b, "\t%s)\n\t\tif (( CURRENT == 2 )); then\n\t\t\t_values verb %s\n\t\t\treturn\n\t\tfi\n\t\tcmd=\"$cmd ${words[2]}\"\n\t\tshift words\n\t\t(( CURRENT-- ))\n\t\t;;\n",
			name, strings.Join(verbs[name], " "))
	}
	b.WriteString("\tesac\n\tcase $cmd in\n")
	for _, c := range cmds {
		fmt.Fprintf(&b, "\t%s)\n\t\t_arguments -s \\\n", zshQuote(c.name()))
		for _, f := range c.flags {
			spec := zshFlagSpec(f)
			fmt.Fprintf(&b, "\t\t\t%s \\\n", spec)
		}
		b.WriteString("\t\t\t'--help[print the usage]' '*:argument: '\n\t\t;;\n")
	}
	b.WriteString("\tesac\n}\n_fleetgate \"$@\"\n")
	return b.String()
}

// zshFlagSpec is an _arguments spec for f: "(-c --config)"{-c,--config}"[help]:FILE:_files".
func zshFlagSpec(f cliFlag) string {
	help := strings.NewReplacer("[", "(", "]", ")", ": ", ", ", ":", " ", "'", "").Replace(f.help)
	action := ""
	switch {
	case f.arg == "FILE":
		action = ":" + f.arg + ":_files"
	case valueWords[f.arg] != "":
		action = ":" + f.arg + ":(" + valueWords[f.arg] + ")"
	case f.arg != "":
		action = ":" + f.arg + ": "
	}
	if len(f.names) == 1 {
		return zshQuote(f.names[0] + "[" + help + "]" + action)
	}
	return zshQuote("("+strings.Join(f.names, " ")+")") + "{" + strings.Join(f.names, ",") + "}" + zshQuote("["+help+"]"+action)
}

// zshQuote quotes s in single quotes for zsh.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func sortedKeysOf[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
