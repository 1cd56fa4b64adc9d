module aralez/bench/connload

go 1.21
