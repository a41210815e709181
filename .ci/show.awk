# Keeps a go test -v log readable. It prints go test's verdict lines, the lines that match the
# regular expression in the environment variable SHOW (result and report lines kept for the
# record), and every test log entry that reads like a failure, whole: with its indented
# continuation lines, such as a consumer's log tail after "exited before it was stopped".
BEGIN {
	verdict = "^(---|ok|FAIL|PASS|panic)|^[ \t]+--- |Error|WARNING: DATA RACE"
	failure = "(error|fail|exited|did not|panic|race|timed out|timeout)"
}
function entry(line) { return line ~ /^    +[^ ]+\.go:[0-9]+: / }
{
	# An entry with nothing after its file:line is a require block ("Error Trace:" follows).
	if (entry($0)) { keep = tolower($0) ~ failure || $0 ~ /\.go:[0-9]+: *$/ }
	else if ($0 !~ /^        /) { keep = 0 }
	if (keep || $0 ~ verdict || (ENVIRON["SHOW"] != "" && $0 ~ ENVIRON["SHOW"])) print
}
