"""Context-free grammars the tests send (in GBNF and in Lark), each with the same language
written for Python's Lark: the independent parser their outputs must satisfy. Every language is
finite, so a sampled output always ends."""

from __future__ import annotations

ARITHMETIC_LARK = r"""
start: term (OP term)? (OP term)?
term: NUMBER | "(" NUMBER OP NUMBER ")"
OP: "+" | "-" | "*" | "/"
NUMBER: /[0-9]{1,3}/
"""
ARITHMETIC_GBNF = r"""
root ::= term (op term)? (op term)?
term ::= number | "(" number op number ")"
op ::= "+" | "-" | "*" | "/"
number ::= [0-9] [0-9]? [0-9]?
"""
SQL_LARK = r"""
start: "SELECT " cols " FROM " NAME where?
cols: NAME (", " NAME)? | "*"
where: " WHERE " NAME " = " (NUMBER | STRING)
NAME: /[a-z][a-z_]{0,7}/
NUMBER: /[0-9]{1,4}/
STRING: /'[a-z ]{0,8}'/
"""
SQL_GBNF = r"""
root ::= "SELECT " cols " FROM " name where?
cols ::= name (", " name)? | "*"
where ::= " WHERE " name " = " (number | string)
name ::= [a-z] [a-z_]? [a-z_]? [a-z_]?
number ::= [0-9] [0-9]? [0-9]?
string ::= "'" [a-z ]? [a-z ]? [a-z ]? "'"
"""
LIST_LARK = r"""
start: "[" (inner ("," inner)?)? "]"
inner: WORD | "[" (WORD ("," WORD)?)? "]"
WORD: /[a-z]{1,3}/
"""
LIST_GBNF = r"""
root ::= "[" (inner ("," inner)?)? "]"
inner ::= word | "[" (word ("," word)?)? "]"
word ::= [a-z] [a-z]? [a-z]?
"""
PARSERS = {"arithmetic": ARITHMETIC_LARK, "sql": SQL_LARK, "list": LIST_LARK}
GRAMMARS = [("lark", ARITHMETIC_LARK, "arithmetic"), ("ebnf", ARITHMETIC_GBNF, "arithmetic"),
            ("lark", SQL_LARK, "sql"), ("ebnf", SQL_GBNF, "sql"),
            ("lark", LIST_LARK, "list"), ("ebnf", LIST_GBNF, "list")]


