// Command hello prints its name: the executable buildtest's test builds.
package main

import "fmt"

func main() { fmt.Println("hello") }
