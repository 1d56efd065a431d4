package eai

import "context"

// Pager walks every row of a list, a page at a time, as you call Next:
//
//	it := c.Invocations.Iter(eai.InvocationFilter{Tool: "jira.search"})
//	for it.Next(ctx) {
//		inv := it.Current()
//	}
//	if err := it.Err(); err != nil { … }
type Pager[T any] struct {
	fetch  func(ctx context.Context, cursor string) (*Page[T], error)
	rows   []T
	index  int
	cursor string
	done   bool
	err    error
	pages  int
	cur    T
}

func newPager[T any](fetch func(ctx context.Context, cursor string) (*Page[T], error)) *Pager[T] {
	return &Pager[T]{fetch: fetch, index: -1}
}

// Next advances to the next row, fetching the next page when needed; false at the end
// or on an error (see Err).
func (p *Pager[T]) Next(ctx context.Context) bool {
	for {
		if p.err != nil {
			return false
		}
		if p.index+1 < len(p.rows) {
			p.index++
			p.cur = p.rows[p.index]
			return true
		}
		if p.done {
			return false
		}
		page, err := p.fetch(ctx, p.cursor)
		if err != nil {
			p.err = err
			return false
		}
		p.pages++
		p.rows, p.index = page.Results, -1
		if page.NextCursor == nil || *page.NextCursor == "" {
			p.done = true
		} else {
			p.cursor = *page.NextCursor
		}
	}
}

// Current is the row Next moved to.
func (p *Pager[T]) Current() T { return p.cur }

// Err is the error that stopped the walk, if any.
func (p *Pager[T]) Err() error { return p.err }

// Pages is how many pages were fetched so far.
func (p *Pager[T]) Pages() int { return p.pages }
